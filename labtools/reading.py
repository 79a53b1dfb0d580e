"""What a learner meets in each lesson, counted: the figures of the learning path's budget.

    python -m labtools.reading          # a table, one row per notebook, and the totals
    python -m labtools.reading --json   # the same, for a script

Per notebook: words of prose (markdown), the longest markdown cell, lines of code (non-blank,
``%%writefile`` scripts included), the set-up's lines of code before the first numbered
section (``## 1.``), the lines of the first script a lesson writes, the exercises (cells tagged
``solution``) and how many of them are a job (their solution or check cell launches one, or
checks one with ``exercise.job``), and the paragraphs that argue with "the guide", a text the
learner never sees.

And the learner's path through it:

- ``rec lines``: lines of the lesson's own code cells (not the set-up cell with
  ``lesson.start``, not an exercise's solution or check cells, not the scripts) spent on the
  record (helpers.record: a call of ``rec.add``, ``rec.skip``, ``rec.figure``, ``rec.write``...
  or a call handed ``rec``), each line of such a call counted;
- ``kit imports``: lines importing ``helpers`` inside the taught scripts (``%%writefile``
  cells);
- ``plain scripts``: "k/n" of the ``.py`` scripts the lesson writes that import nothing from
  ``helpers``, not even through a taught script they import (this lesson's, or another's, as
  ``helpers.cell_scripts.ensure_script`` brings them): these run with plain torchrun outside
  the kit;
- ``exercises in place``: "k/n" exercises whose cells come before the ``## Summary`` heading,
  beside the section they practise rather than at the end;
- ``unsolved``: "k/n" exercises that the learner's copy (labtools.student, ``make lab``) hands
  out as a stub. An exercise is a ``solution`` cell with the code cells after it (its check),
  or a check cell (``exercise.*(...)``) with no solution cell before it: that one is not
  stubbed.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat

from helpers.paths import NOTEBOOKS
from labtools import student

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
    "rec_lines": "rec lines",
    "kit_imports": "kit imports",
    "plain_scripts": "plain scripts",
    "exercises_in_place": "exercises in place",
    "unsolved": "unsolved",
}
FRACTIONS = ("plain_scripts", "exercises_in_place", "unsolved")  # "k/n"; their totals add up
CHECK = re.compile(r"\bexercise\.\w+\(")
SUMMARY = re.compile(r"^#{2,3} Summary\b", re.M)


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


def reading(
    nb: nbformat.NotebookNode, elsewhere: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """The figures of one notebook (see the module's docstring).

    ``elsewhere``: the taught scripts of other lessons, by module name, and whether each
    reaches ``helpers`` (``every_lesson`` passes them), for a script that imports one.
    """
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
        **learners_path(nb, elsewhere or {}),
    }


def _exercise(nb: nbformat.NotebookNode, solution: int) -> list[nbformat.NotebookNode]:
    """A solution cell and the code cells after it up to the next markdown cell (its check)."""
    cells = [nb.cells[solution]]
    for cell in nb.cells[solution + 1 :]:
        if cell.cell_type == "markdown":
            break
        cells.append(cell)
    return cells


def _python(source: str) -> str:
    """A code cell as Python: IPython's magics and shell lines become ``pass`` (same lines)."""
    lines = source.split("\n")
    if lines and lines[0].lstrip().startswith("%%"):
        lines[0] = ""
    return "\n".join(
        line[: len(line) - len(line.lstrip())] + "pass" if line.lstrip()[:1] in ("%", "!") else line
        for line in lines
    )


def _rec_lines(source: str) -> int:
    """Lines of a cell taken by calls of the record: ``rec.<method>(...)`` or ``f(..., rec)``."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return sum(1 for line in source.splitlines() if re.search(r"\brec\.\w+\(", line))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, args = node.func, [*node.args, *(k.value for k in node.keywords)]
        on_rec = isinstance(func, ast.Attribute) and _is_rec(func.value)
        if on_rec or any(_is_rec(a) for a in args):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return len(lines)


def _is_rec(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "rec"


def scripts(nb: nbformat.NotebookNode) -> dict[str, str]:
    """The ``.py`` scripts the lesson's ``%%writefile`` cells write: path -> text (``-a`` cells
    appended)."""
    found: dict[str, str] = {}
    for cell in nb.cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type != "code" or not first.startswith("%%writefile"):
            continue
        words = shlex.split(first)
        path = words[-1]
        if path.endswith(".py"):
            appends = "-a" in words or "--append" in words
            found[path] = (found.get(path, "") if appends else "") + body + "\n"
    return found


def _imports(text: str) -> tuple[int, set[str]]:
    """A script's lines importing ``helpers`` and the top-level modules it imports."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        kit = [ln for ln in text.splitlines() if re.match(r"\s*(from|import)\s+helpers\b", ln)]
        return len(kit), set()
    kit, modules = 0, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        tops = {name.partition(".")[0] for name in names}
        modules |= tops
        if "helpers" in tops:
            kit += node.end_lineno - node.lineno + 1
    return kit, modules


def script_kit(nb: nbformat.NotebookNode, elsewhere: Mapping[str, bool]) -> dict[str, bool]:
    """Module name of each script the lesson writes -> whether it reaches ``helpers``,
    directly or through a taught script it imports (this lesson's first, else ``elsewhere``)."""
    found = {
        path.rsplit("/", 1)[-1].removesuffix(".py"): _imports(text)
        for path, text in scripts(nb).items()
    }

    def reaches(name: str, seen: frozenset[str]) -> bool:
        if name not in found:
            return elsewhere.get(name, False)
        kit, modules = found[name]
        return bool(kit) or any(
            reaches(m, seen | {name}) for m in modules - seen if m != name and m != "helpers"
        )

    return {name: reaches(name, frozenset()) for name in found}


def _exercises(nb: nbformat.NotebookNode) -> list[list[int]]:
    """Each exercise's code cells by index: a solution cell and the code cells after it up to
    its check (``exercise.*(...)``), or a check cell with no solution before it."""
    found, taken = [], set()
    for i, cell in enumerate(nb.cells):
        if "solution" in cell.metadata.get("tags", []):
            block = [i + k for k in range(len(_exercise(nb, i)))]
            checks = [j for j in block if CHECK.search(nb.cells[j].source)]
            block = block[: block.index(checks[0]) + 1] if checks else block  # not what follows
            found.append(block)
            taken.update(block)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and i not in taken and CHECK.search(cell.source):
            found.append([i])
    return sorted(found)


def _learners_version(cell: nbformat.NotebookNode) -> str:
    """The cell as the learner's copy has it (labtools.student); a solution cell that is not
    Python (a cell magic) cannot be stubbed there and stays as it is here."""
    if "solution" not in cell.metadata.get("tags", []):
        return cell.source
    try:
        return student.stub(cell.source)
    except SyntaxError:
        return cell.source


def learners_path(nb: nbformat.NotebookNode, elsewhere: Mapping[str, bool]) -> dict[str, Any]:
    """The columns of the learner's path (see the module's docstring)."""
    exercises = _exercises(nb)
    exercise_cells = {i for block in exercises for i in block}
    teaching = [
        c.source
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and i not in exercise_cells
        and "lesson.start(" not in c.source
        and not c.source.startswith("%%writefile")
    ]
    texts = scripts(nb)
    kit = script_kit(nb, elsewhere)
    summary = next(
        (
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "markdown" and SUMMARY.search(c.source)
        ),
        len(nb.cells),
    )
    learner = [_learners_version(c) for c in nb.cells]
    stubbed = [any(learner[i].startswith(student.TODO) for i in block) for block in exercises]
    return {
        "rec_lines": sum(_rec_lines(source) for source in teaching),
        "kit_imports": sum(_imports(text)[0] for text in texts.values()),
        "plain_scripts": f"{sum(not k for k in kit.values())}/{len(kit)}",
        "exercises_in_place": f"{sum(block[0] < summary for block in exercises)}/{len(exercises)}",
        "unsolved": f"{sum(stubbed)}/{len(exercises)}",
    }


def every_lesson(folder: Path = NOTEBOOKS) -> dict[str, dict[str, Any]]:
    """Every lesson's figures, in order; each sees the scripts of the lessons before it."""
    rows, known = {}, {}
    lessons = {
        path.stem: nbformat.read(path, as_version=4)
        for path in sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    }
    for nb in lessons.values():  # a script named in two lessons: the first one's
        for name, reaches in script_kit(nb, known).items():
            known.setdefault(name, reaches)
    for stem, nb in lessons.items():
        rows[stem] = reading(nb, known)
    return rows


def _add(values: list[Any]) -> Any:
    """A column's total: a sum, or "k/n" fractions added part by part."""
    if all(isinstance(v, str) for v in values) and values:
        parts = [v.split("/") for v in values]
        return f"{sum(int(k) for k, _ in parts)}/{sum(int(n) for _, n in parts)}"
    return sum(values)


def table(rows: dict[str, dict[str, Any]]) -> str:
    names = list(FIELDS)
    lines = ["| notebook | " + " | ".join(FIELDS.values()) + " |", "|---" * (len(names) + 1) + "|"]
    for stem, row in rows.items():
        lines.append(f"| {stem} | " + " | ".join(str(row[n]) for n in names) + " |")
    totals = {n: _add([r[n] for r in rows.values()]) for n in names}
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
    parser.add_argument(
        "--folder", default=str(NOTEBOOKS), help="the lessons to count (default: notebooks/)"
    )
    args = parser.parse_args(argv)
    rows = every_lesson(Path(args.folder))
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
