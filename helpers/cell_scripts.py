"""Scripts written by notebook cells, recovered from the notebook that teaches them.

A script such as ``work/ddp_train.py`` has one source: the ``%%writefile`` cell of the lesson
that explains it. Later lessons (mixed precision, profiling, multi-node) reuse it; when the
reader has not run that lesson in this checkout, the cell's text is written out from the
notebook file instead of being copied into a second place.

A learner may also edit such a script in JupyterLab's editor: ``keep_edits`` makes sure that
running its cell again never silently throws that edit away.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def _written_by(cell: str) -> Path | None:
    """The file a ``%%writefile`` cell writes (or appends to), resolved from the working dir."""
    first = cell.lstrip().partition("\n")[0]
    if not first.startswith("%%writefile"):
        return None
    words = shlex.split(first)
    return Path(words[-1]).resolve() if len(words) > 1 else None


class EditKeeper:
    """Keeps a script's edits made outside its cell before the cell writes the file again.

    After each ``%%writefile`` cell it remembers what the file holds. Before the next one
    writes that file, a file that no longer holds it was edited elsewhere (JupyterLab's editor,
    a terminal): it is copied to ``<name>.edited-<n>`` and one line says where, then the cell
    writes its own text as it always does.
    """

    def __init__(self) -> None:
        self.written: dict[Path, str] = {}

    def before(self, info: Any) -> None:
        path = _written_by(getattr(info, "raw_cell", "") or "")
        if path is None or not path.is_file() or path not in self.written:
            return
        text = path.read_text()
        if text == self.written[path]:
            return
        n = 1
        while (kept := path.with_name(f"{path.name}.edited-{n}")).exists():
            n += 1
        kept.write_text(text)
        print(
            f"{path.name} was edited outside its cell since the cell wrote it: your version is "
            f"kept as {kept} (this cell now writes its own text)."
        )

    def after(self, result: Any) -> None:
        path = _written_by(getattr(getattr(result, "info", None), "raw_cell", "") or "")
        if path is not None and path.is_file():
            self.written[path] = path.read_text()


_KEEPER: EditKeeper | None = None


def keep_edits() -> EditKeeper | None:
    """Watch this kernel's ``%%writefile`` cells (once per kernel; nothing outside IPython)."""
    global _KEEPER
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or _KEEPER is not None:
        return _KEEPER
    _KEEPER = EditKeeper()
    shell.events.register("pre_run_cell", _KEEPER.before)
    shell.events.register("post_run_cell", _KEEPER.after)
    return _KEEPER
