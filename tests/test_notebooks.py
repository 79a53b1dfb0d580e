"""The headless harness: every notebook in notebooks/ is picked up without editing this file.

Each is executed once in quick mode with papermill (conftest.notebook_run), its metrics.json
checked against the record contract. Notebooks with cells marked ``# NBVAL_CHECK_OUTPUT`` are
then re-executed under nbval in lax mode, where those cells must reproduce papermill's output
after sanitising (a second run of a notebook without checked cells would only cost CI time).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import catalog, runner

STEMS = runner.notebook_stems()
SANITIZE = Path(__file__).with_name("nbval_sanitize.cfg")
MIN_SECONDS = 1.0  # a notebook that "ran" faster than this did not run its lesson


def test_there_are_notebooks():
    assert "00_environment" in STEMS


def test_catalog_lists_every_notebook_in_order():
    assert [e["stem"] for e in runner.catalog()] == STEMS


def test_start_page_is_written_from_the_catalog():
    assert catalog.START_PAGE.read_text() == catalog.start_page(), (
        "notebooks/README.md is stale: run `python -m helpers.catalog`"
    )


@pytest.mark.parametrize("stem", STEMS)
def test_committed_without_outputs(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count)]  # fmt: skip
    assert not dirty, f"{stem}: cells {dirty} have stored outputs; clear them before committing"


@pytest.mark.parametrize("stem", STEMS)
def test_anatomy(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "What you will learn" in nb.cells[0].source
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, "exactly one cell tagged 'parameters'"
    assert "out_dir" in params[0].source and "quick" in params[0].source
    assert "rec.write(" in nb.cells[-1].source, "the last cell writes metrics.json"


@pytest.mark.notebook
@pytest.mark.parametrize("stem", STEMS)
def test_executes_headless_and_leaves_its_record(stem, notebook_run, notebook_record):
    record = notebook_record(stem)
    assert record["notebook"] == stem
    assert record["params"]["quick"] is True
    assert record["hardware"]["device"] in ("cpu", "cuda", "mps")
    assert record["seconds"] >= MIN_SECONDS, f"{stem} finished in {record['seconds']} s"
    for skip in record["skipped"]:
        assert skip["what"] and skip["why"], "every skip says what and why"
    executed = nbformat.read(notebook_run(stem).output, as_version=4)
    unexecuted = [i for i, c in enumerate(executed.cells)
                  if c.cell_type == "code" and c.execution_count is None]  # fmt: skip
    assert not unexecuted, f"cells {unexecuted} of {stem} never ran"
    figures = list(Path(notebook_run(stem).out_dir).glob("*.png"))
    assert figures, f"{stem} saved no figure next to metrics.json"
    json.dumps(record)  # plain JSON all the way down


@pytest.mark.notebook
@pytest.mark.parametrize("stem", STEMS)
def test_leaves_no_process_behind(stem, notebook_run):
    outcome = notebook_run(stem)
    left = runner.leftover_processes(outcome.out_dir)
    assert not left, f"{stem} left processes running: {left}"


@pytest.mark.notebook
@pytest.mark.parametrize("stem", STEMS)
def test_nbval_reproduces_checked_outputs(stem, notebook_run, tmp_path):
    source = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    if not any("NBVAL_CHECK_OUTPUT" in c.source for c in source.cells if c.cell_type == "code"):
        pytest.skip("no cell marked # NBVAL_CHECK_OUTPUT: the papermill run already executed it")
    outcome = notebook_run(stem)
    assert outcome.status == "ok", outcome.error
    proc = rerun_under_nbval(stem, nbformat.read(outcome.output, as_version=4), tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.notebook
def test_nbval_catches_a_changed_output(notebook_run, tmp_path):
    """The test of the test: a checked cell whose recorded output was different must fail."""
    executed = nbformat.read(notebook_run("00_environment").output, as_version=4)
    checked = [c for c in executed.cells if c.source.startswith("# NBVAL_CHECK_OUTPUT")]
    checked[0].outputs[0]["text"] = "has torch.cuda.get_current_device: True\n"
    proc = rerun_under_nbval("00_environment", executed, tmp_path)
    assert proc.returncode != 0 and "get_current_device" in proc.stdout


def rerun_under_nbval(stem: str, executed, tmp_path: Path) -> subprocess.CompletedProcess:
    """nbval in lax mode over papermill's executed notebook, its record sent to tmp_path."""
    for cell in executed.cells:  # send the rerun's record elsewhere, keep quick mode
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.source = f"out_dir = {str(tmp_path / 'out')!r}\nquick = True\n"
    path = tmp_path / f"{stem}.ipynb"
    nbformat.write(executed, path)
    timeout = runner.catalog_entry(stem)["timeout_quick_s"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
         f"--nbval-kernel-name={runner.kernel_name()}", f"--nbval-cell-timeout={timeout}",
         f"--sanitize-with={SANITIZE}", "--rootdir", str(tmp_path), str(path)],
        cwd=runner.NOTEBOOKS, capture_output=True, text=True, timeout=timeout + 120,
    )  # fmt: skip
