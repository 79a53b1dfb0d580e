"""Scripts written by notebook cells, recovered from the notebook that teaches them.

A script such as ``work/ddp_train.py`` has one source: the ``%%writefile`` cell of the lesson
that explains it. Later lessons (mixed precision, profiling, multi-node) reuse it; when the
reader has not run that lesson in this checkout, the cell's text is written out from the
notebook file instead of being copied into a second place.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import nbformat

from helpers.paths import NOTEBOOKS


def writefile_cells(notebook: str) -> Iterator[tuple[str, bool, str]]:
    """(script, appends?, body) of each ``%%writefile`` cell of ``notebook``, in order."""
    nb = nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", as_version=4)
    for cell in nb.cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type != "code" or not first.startswith("%%writefile"):
            continue  # other first lines are Python, which shlex cannot always split
        words = shlex.split(first)
        if words[:1] == ["%%writefile"]:
            yield words[-1], "-a" in words or "--append" in words, body


def cell_script(notebook: str, script: str) -> str:
    """What the ``%%writefile <script>`` cell (and any ``%%writefile -a`` cells after it) write.

    A long script is taught in short cells: the first writes the file, the next append to it.
    """
    text = None
    for written, appends, body in writefile_cells(notebook):
        if written != script:
            continue
        if not appends:
            text = ""
        elif text is None:
            raise LookupError(f"{notebook}: '%%writefile -a {script}' before the cell creating it")
        text += body + "\n"
    if text is None:
        raise LookupError(f"notebooks/{notebook}.ipynb has no '%%writefile {script}' cell")
    return text


def ensure_script(notebook: str, script: str, cwd: str | Path = ".") -> Path:
    """Write ``script`` (relative to ``cwd``) from its lesson's cell, unless it is current."""
    path = Path(cwd) / script
    text = cell_script(notebook, script)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"Wrote {script} from the %%writefile cell of {notebook}.ipynb")
    return path
