"""What a learner meets in each lesson, counted: the figures of the learning path's budget.

    python -m labtools.reading          # a table, one row per notebook, and the totals
    python -m labtools.reading --json   # the same, for a script

Per notebook: words of prose (markdown), the longest markdown cell, lines of code (non-blank,
``%%writefile`` scripts included), the set-up's lines of code before the first numbered
section (``## 1.``), the lines of the first script a lesson writes, the exercises (cells tagged
``solution``) and how many of them are a job (their solution or check cell launches one, or
checks one with ``exercise.job``), and the paragraphs that argue with "the guide", a text the
learner never sees.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

import nbformat

from helpers.paths import NOTEBOOKS

SECTION = re.compile(r"^#{2,3} \d+\.", re.M)  # "## 1. ..." opens the lesson's content
WORD = re.compile(r"[A-Za-z0-9_`'’.-]+")
LAUNCH = re.compile(r"\btorchrun\(|\blaunch\.(torchrun|Job)\b|\bexercise\.job\(")
FIELDS = {
    "words": "prose words",
    "longest_cell": "longest cell",
    "code_lines": "code lines",
    "setup_lines": "set-up lines",
    "first_script": "first script",
    "exercises": "exercises",
    "job_exercises": "run a job",
    "guide_cells": "'guide' cells",
}


def _code_lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


def _words(source: str) -> int:
    return len(WORD.findall(source))


# A reader's pace for the header's estimate: prose read at 200 words a minute, code followed
# at 20 lines a minute (scripts and cells alike); outputs and exercises not counted.
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 200, 20


def reading_minutes(figures: dict[str, int]) -> int:
    """The header's estimated reading time from ``reading()``'s figures, in 5-minute steps."""
    minutes = figures["words"] / WORDS_PER_MINUTE + figures["code_lines"] / CODE_LINES_PER_MINUTE
    return max(5, 5 * round(minutes / 5))


def reading(nb: nbformat.NotebookNode) -> dict[str, int]:
    """The figures of one notebook (see the module's docstring)."""
    markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    first_section = next(
        (
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and SECTION.search(c.source)
        ),
        len(nb.cells),
    )
    scripts = [c.source for c in code if c.source.startswith("%%writefile")]
    target = [s.split("\n", 1)[0].split()[-1] for s in scripts]  # -a appends to the same file
    first_script = sum(
        _code_lines(s.partition("\n")[2])
        for s, path in zip(scripts, target, strict=True)
        if path == target[0]
    )
    solutions = [i for i, c in enumerate(nb.cells) if "solution" in c.metadata.get("tags", [])]
    job_exercises = sum(
        1 for i in solutions if any(LAUNCH.search(c.source) for c in _exercise(nb, i))
    )
    return {
        "words": sum(_words(m) for m in markdown),
        "longest_cell": max((_words(m) for m in markdown), default=0),
        "code_lines": sum(_code_lines(c.source) for c in code),
        "setup_lines": sum(
            _code_lines(c.source) for c in nb.cells[:first_section] if c.cell_type == "code"
        ),
        "first_script": first_script,
        "exercises": len(solutions),
        "job_exercises": job_exercises,
        "guide_cells": sum(1 for m in markdown if re.search(r"\bguide\b", m, re.I)),
    }


def _exercise(nb: nbformat.NotebookNode, solution: int) -> list[nbformat.NotebookNode]:
    """A solution cell and the code cells after it up to the next markdown cell (its check)."""
    cells = [nb.cells[solution]]
    for cell in nb.cells[solution + 1 :]:
        if cell.cell_type == "markdown":
            break
        cells.append(cell)
    return cells


def every_lesson() -> dict[str, dict[str, int]]:
    return {
        path.stem: reading(nbformat.read(path, as_version=4))
        for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    names = list(FIELDS)
    lines = ["| notebook | " + " | ".join(FIELDS.values()) + " |", "|---" * (len(names) + 1) + "|"]
    for stem, row in rows.items():
        lines.append(f"| {stem} | " + " | ".join(str(row[n]) for n in names) + " |")
    totals = {n: sum(r[n] for r in rows.values()) for n in names}
    totals["longest_cell"] = max((r["longest_cell"] for r in rows.values()), default=0)
    lines.append("| all | " + " | ".join(str(totals[n]) for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m labtools.reading",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    rows = every_lesson()
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
