"""The clients users execute a notebook with, and which of them the test session uses for each.

A ``make test`` executes every lesson once, with one client, and the harness checks that run
whatever the client (tests/test_notebooks.py): a second run would only repeat the first.

- **nbval** runs the lessons with cells marked ``# NBVAL_CHECK_OUTPUT``: the whole notebook, in
  lax mode, comparing those cells with the outputs recorded in ``tests/nbval/<stem>.json`` (after
  ``tests/nbval_sanitize.cfg``). A changed lesson output is a regression; a changed checked
  cell is recorded again by ``make sync`` (labtools.recordings).
- **nbconvert** (``jupyter nbconvert --to notebook --execute``) runs ``NBCONVERT`` as a user
  runs it: no parameter injection, its parameters cell edited.
- **papermill** (the kit's runner, ``labtools.runner.execute``) runs the others.

Notebook 02 and 14 run twice at once as a classroom (conftest.py), which issue 15 asks for.
"""

from __future__ import annotations

import functools
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

from labtools import catalog, runner
from labtools.recordings import checked_cells, lesson, recorded

HERE = Path(__file__).resolve().parent
SANITIZE = HERE / "nbval_sanitize.cfg"
NBCONVERT = ("05_profiling",)  # quick, and not in the browser test or the classroom


@functools.cache  # asked at collection and again at each run
def client_of(stem: str) -> str:
    if checked_cells(lesson(stem)):
        return "nbval"
    return "nbconvert" if stem in NBCONVERT else "papermill"


def execute(stem: str, out_dir: Path) -> runner.Outcome:
    """The test session's one run of a lesson in quick mode, by its client."""
    client = client_of(stem)
    if client == "nbval":
        return run_nbval(stem, out_dir)
    if client == "nbconvert":
        return run_nbconvert(stem, out_dir)
    return runner.execute(stem, out_dir, quick=True)


def budget(stem: str) -> float:
    return float(catalog.catalog_entry(stem)["timeout_quick_s"])


def run_nbconvert(stem: str, out_dir: Path) -> runner.Outcome:
    """``jupyter nbconvert --execute`` on a copy whose parameters cell says quick mode and where
    to write, the only lines a user would edit (nbconvert injects nothing)."""
    out_dir = Path(out_dir).resolve()
    nb = lesson(stem)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = re.sub(r"(?m)^quick = .*$", "quick = True", cell.source)
    cell.source = re.sub(
        r"(?m)^out_dir = .*$", lambda _: f"out_dir = {str(out_dir)!r}", cell.source
    )
    source = out_dir / f"{stem}.as_is.ipynb"
    nbformat.write(nb, source)
    output = out_dir / f"{stem}.ipynb"
    argv = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute"]
    argv += [f"--ExecutePreprocessor.kernel_name={runner.kernel_name()}"]
    argv += [f"--ExecutePreprocessor.timeout={int(budget(stem))}", str(source)]
    argv += ["--output", output.name, "--output-dir", str(out_dir)]
    start = time.perf_counter()
    code, log = runner.run_marked(argv, out_dir, budget(stem), cwd=runner.NOTEBOOKS)
    error = None if code == 0 else f"nbconvert exit {code}:\n" + log[-3000:]
    if code is None:
        error = runner.timed_out(budget(stem))
    return runner.finished(stem, start, output, out_dir, error)


def run_nbval(stem: str, out_dir: Path) -> runner.Outcome:
    """nbval over the lesson with papermill's quick parameters injected (``--prepare-only``: no
    execution) and the recorded outputs put back into the checked cells."""
    out_dir = Path(out_dir).resolve()
    prepared = out_dir / "nbval" / f"{stem}.ipynb"
    argv = [sys.executable, "-m", "papermill", str(runner.NOTEBOOKS / f"{stem}.ipynb")]
    argv += [str(prepared), "--prepare-only", "-k", runner.kernel_name()]
    argv += ["-p", "out_dir", str(out_dir), "-p", "quick", "True"]
    start = time.perf_counter()
    prepared.parent.mkdir(parents=True, exist_ok=True)
    code, log = runner.run_marked(argv, out_dir, 120)
    if code != 0:
        return runner.finished(stem, start, prepared, out_dir, f"papermill --prepare-only:\n{log}")
    nb = nbformat.read(prepared, as_version=4)
    expected = {c["id"]: c["outputs"] for c in recorded(stem)["cells"]}
    for cell in checked_cells(nb):
        cell.outputs = [nbformat.from_dict(o) for o in expected.get(cell.id, [])]
        cell.execution_count = 1  # nbval refuses outputs of a cell that says it never ran
    nbformat.write(nb, prepared)
    error = nbval(prepared, out_dir, budget(stem))
    executed = prepared.with_suffix(".executed.ipynb")  # written by tests/nbval_capture.py
    output = out_dir / f"{stem}.ipynb"
    if executed.exists():
        executed.replace(output)
    return runner.finished(stem, start, output, out_dir, error)


# pytest with this folder importable, so that nbval's run loads tests/nbval_capture.py
PYTEST = f"import sys; sys.path.insert(0, {str(HERE)!r}); import pytest; sys.exit(pytest.main())"


def nbval(path: Path, out_dir: Path, timeout: float) -> str | None:
    """Run nbval in lax mode over one notebook: None when every code cell ran without an error
    and every checked cell gave its stored output, else nbval's report."""
    report = path.with_suffix(".xml")
    argv = [sys.executable, "-c", PYTEST, "-q", "-p", "no:cacheprovider", "-p", "nbval_capture"]
    argv += ["--nbval-lax", f"--nbval-kernel-name={runner.kernel_name()}"]
    argv += [f"--nbval-cell-timeout={timeout}", f"--nbval-sanitize-with={SANITIZE}"]
    argv += ["--rootdir", str(path.parent), f"--junitxml={report}", str(path)]
    code, log = runner.run_marked(argv, out_dir, timeout, cwd=runner.NOTEBOOKS)
    if code is None:
        return runner.timed_out(timeout)
    cells = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
    root = ET.parse(report).getroot() if report.exists() else ET.Element("testsuite")
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    if code == 0 and counts == {"tests": cells, "failures": 0, "errors": 0, "skipped": 0}:
        return None
    first = next((f.text or "" for f in suite.iter("failure")), "")  # the cause; later cells
    first = f"the first failing cell:\n{first[-6000:]}\n...\n" if first else ""  # only follow
    return f"nbval exit {code}, {counts} for {cells} code cells:\n{first}" + log[-3000:]
