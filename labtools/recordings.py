"""The outputs nbval checks a lesson against: ``tests/nbval/<stem>.json``.

A code cell that starts with ``# NBVAL_CHECK_OUTPUT`` prints facts that must not change (an API
that exists, a device plan for given inputs). Its source and the outputs of a quick-mode run are
recorded here; tests/clients.py hands them to nbval, which compares every later run with them
(after tests/nbval_sanitize.cfg). A checked cell whose source changed is recorded again by
``make sync``, which runs that lesson once.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import nbformat

from helpers.paths import NOTEBOOKS, REPO_ROOT

RECORDED = REPO_ROOT / "tests" / "nbval"
CHECK = "# NBVAL_CHECK_OUTPUT"


def checked_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(CHECK)]


def lesson(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def recorded(stem: str) -> dict:
    path = RECORDED / f"{stem}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `make sync` records it")
    return json.loads(path.read_text())


def stale_recordings() -> list[str]:
    """Lessons whose checked cells are not the recorded ones (a file to write or to delete)."""
    stale = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        cells = {c.id: c.source for c in checked_cells(lesson(path.stem))}
        file = RECORDED / f"{path.stem}.json"
        kept = {c["id"]: c["source"] for c in recorded(path.stem)["cells"]} if file.exists() else {}
        if cells != kept or (file.exists() and not cells):
            stale.append(path.stem)
    return stale


def record(stem: str) -> Path:
    """Execute the lesson with papermill in quick mode and keep its checked cells' outputs (or
    delete the file of a lesson that has no checked cell any more)."""
    from labtools import runner

    path = RECORDED / f"{stem}.json"
    if not checked_cells(lesson(stem)):
        path.unlink(missing_ok=True)
        return path
    with tempfile.TemporaryDirectory() as tmp:
        run = runner.execute(stem, Path(tmp), quick=True)
        if run.status != "ok":
            raise RuntimeError(f"{stem} failed, nothing recorded:\n{run.error}")
        executed = nbformat.read(run.output, as_version=4)
    cells = [
        {
            "id": c.id,
            "source": c.source,
            "outputs": [{k: v for k, v in o.items() if k != "execution_count"} for o in c.outputs],
        }
        for c in checked_cells(executed)
    ]
    if not all(c["outputs"] for c in cells):
        raise RuntimeError(f"{stem}: a checked cell printed nothing; nbval would compare nothing")
    RECORDED.mkdir(exist_ok=True)
    path.write_text(json.dumps({"notebook": stem, "cells": cells}, indent=1, ensure_ascii=False))
    return path
