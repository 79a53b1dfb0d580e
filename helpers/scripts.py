"""Scripts written by notebook cells, recovered from the notebook that teaches them.

A script such as ``work/ddp_train.py`` has one source: the ``%%writefile`` cell of the lesson
that explains it. Later lessons (mixed precision, profiling, multi-node) reuse it; when the
reader has not run that lesson in this checkout, the cell's text is written out from the
notebook file instead of being copied into a second place.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat

from helpers.paths import NOTEBOOKS


def _writefile_cells(notebook: str) -> Iterator[tuple[str, bool, str]]:
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
    for written, appends, body in _writefile_cells(notebook):
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


# Committed copies for jobs that run without a notebook (the Slurm and Kubernetes templates,
# benchmarks/): a job never parses notebook JSON, and never writes into the checkout.
# `make scripts` regenerates them; tests/test_scripts.py fails when one differs from its cell.
EXPORTED = {"scripts/ddp_train.py": ("02_distributed_data_parallel", "work/ddp_train.py")}
ROOT = NOTEBOOKS.parent


def exported_text(path: str) -> str:
    """The committed file's text: a header naming its source, then the cell's script."""
    notebook, script = EXPORTED[path]
    header = (
        f"# Generated from notebooks/{notebook}.ipynb ({script}) by `make scripts`.\n"
        "# Edit the notebook's cell, not this file: a test fails when the two differ.\n"
    )
    return header + cell_script(notebook, script)


def stale_exports() -> list[str]:
    """The committed copies that differ from their cells (missing ones included)."""
    return [p for p in EXPORTED
            if not (ROOT / p).exists() or (ROOT / p).read_text() != exported_text(p)]  # fmt: skip


def export() -> list[str]:
    """Rewrite every stale committed copy; the paths written."""
    written = stale_exports()
    for path in written:
        (ROOT / path).write_text(exported_text(path))
    return written


def written_scripts(notebook: str) -> list[str]:
    """The paths the ``%%writefile`` cells of ``notebook`` write, in order, each once."""
    return list(dict.fromkeys(script for script, _, _ in _writefile_cells(notebook)))


def lesson_scripts() -> list[tuple[str, str, str]]:
    """(notebook, script, text) of every script the lessons write, in lesson order."""
    stems = [nb.stem for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
    return [(stem, script, cell_script(stem, script))
            for stem in stems for script in written_scripts(stem)]  # fmt: skip


def launched_scripts(notebook: str) -> list[str]:
    """The scripts of ``notebook`` that its other code cells start: named by path or by stem
    (``"work/ddp_train.py"``, ``"job_ddp"``); the rest are modules those scripts import."""
    nb = nbformat.read(NOTEBOOKS / f"{notebook}.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code"
                     and not c.source.startswith("%%writefile"))  # fmt: skip

    def named(script: str) -> bool:
        stem = re.escape(Path(script).stem)
        return re.search(rf"""["'](?:work/)?{stem}(?:\.py)?["']""", code) is not None

    return [script for script in written_scripts(notebook) if named(script)]


def lint(ruff: list[str]) -> int:
    """Run ruff over every script the lessons write, as the files the cells produce.

    ruff skips ``%%writefile`` cells inside notebooks, and the project excludes ``work/`` (where
    the scripts land), so each script is written to a temporary folder and checked there with
    the project's settings; the scripts import each other by name (``from shard_model import``),
    so those names count as first-party. ``ruff`` is the command to run, e.g. ``["ruff"]``.
    """
    import subprocess
    import tempfile

    notebooks = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="taught-scripts-") as tmp:
        names = []
        for notebook in notebooks:
            for script in written_scripts(notebook):
                path = Path(tmp) / notebook / Path(script).name
                path.parent.mkdir(exist_ok=True)
                path.write_text(cell_script(notebook, script))
                names.append(path.stem)
        local = f"lint.isort.known-first-party = {sorted(set(names))!r}"
        argv = [*ruff, "check", "--config", str(ROOT / "pyproject.toml"), "--config", local, tmp]
        proc = subprocess.run(argv, capture_output=True, text=True)
        where = re.compile(re.escape(tmp) + r"/([^/]+)/([^/:]+):")  # -> the notebook and script
        print(where.sub(r"notebooks/\1.ipynb, work/\2:", proc.stdout + proc.stderr), end="")
        return proc.returncode


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.scripts", description=__doc__)
    parser.add_argument("command", choices=["export", "check", "lint"], help=(
        "export: rewrite the committed copies (EXPORTED); check: fail when one differs from its "
        "cell; lint: ruff over every script the cells write"))  # fmt: skip
    command = parser.parse_args(argv).command
    if command == "lint":
        return lint([sys.executable, "-m", "ruff"])
    if command == "check":
        stale = stale_exports()
        for path in stale:
            print(f"{path} differs from its notebook cell: run `make scripts`")
        return 1 if stale else 0
    for path in export():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
