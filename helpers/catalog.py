"""The lessons' catalog (notebooks/catalog.json) and the start page written from it.

One machine-readable file holds the order, what each lesson teaches, the hardware it adapts
to and its time budget; the runner takes its timeouts from it, and ``notebooks/README.md`` is
rendered from it (a test keeps the two identical), so nothing is written down twice.

    python -m helpers.catalog        # rewrite notebooks/README.md from catalog.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
START_PAGE = NOTEBOOKS / "README.md"


def catalog() -> list[dict[str, Any]]:
    """The lessons in order, with their time budgets."""
    return json.loads((NOTEBOOKS / "catalog.json").read_text())["notebooks"]


def catalog_entry(stem: str) -> dict[str, Any]:
    for entry in catalog():
        if entry["stem"] == stem:
            return entry
    raise KeyError(f"{stem} is not in notebooks/catalog.json; add it there (order, timeouts).")


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "not measured yet"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def start_page() -> str:
    """notebooks/README.md: the order, what each lesson teaches, hardware and measured time."""
    lines = [
        "# Multi-GPU Lab: start here",
        "",
        "<!-- Written by `python -m helpers.catalog` from catalog.json; edit that file. -->",
        "",
        "Open the notebooks in this order. Each runs top to bottom on the hardware in front of",
        "you (NVIDIA GPUs with NCCL, otherwise CPU with gloo and 2 processes), ends with",
        "exercises and their checks (00–06), and leaves `metrics.json` in its `out_dir`.",
        "Set `quick = True` in a notebook's first code cell for the smallest run.",
        "",
        "| # | notebook | what it teaches | hardware | quick | full |",
        "|---|---|---|---|---|---|",
    ]
    for e in catalog():
        number, _, _ = e["stem"].partition("_")
        measured = e.get("measured", {})
        lines.append(
            f"| {number} | [{e['title']}]({e['stem']}.ipynb) | {e['teaches']} | {e['hardware']} "
            f"| {_minutes(measured.get('quick_s'))} | {_minutes(measured.get('full_s'))} |"
        )
    note = next((e["measured"]["on"] for e in catalog() if "measured" in e), None)
    if note:
        lines += ["", f"Times measured on {note}; `make run` prints them for your machine."]
    return "\n".join(lines) + "\n"


def main() -> int:
    START_PAGE.write_text(start_page())
    print(f"Wrote {START_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
