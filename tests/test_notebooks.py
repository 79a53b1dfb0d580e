"""The headless harness: every notebook in notebooks/ is picked up without editing this file.

Each is executed once in quick mode with papermill's command line (conftest.notebook_run) and
must pass as papermill itself judges it (exit 0, so no cell holds an error output: a lesson
that shows a failure catches it and prints it), its metrics.json checked against the record
contract. nbconvert, the other client users call, runs one lesson as it is. Notebooks with
cells marked ``# NBVAL_CHECK_OUTPUT`` are then re-executed under nbval in lax mode, up to the
last checked cell, where those cells must reproduce papermill's output after sanitising (a
second run of a notebook without checked cells would only cost CI time).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import catalog, runner

STEMS = runner.notebook_stems()
# The Chinese edition of the two quickest lessons (catalog.json's measured times) runs in CI
# too; `make run LANG=zh_CN` runs all of it.
ZH = "zh_CN"
QUICKEST = sorted(
    STEMS, key=lambda s: catalog.catalog_entry(s).get("measured", {}).get("quick_s") or float("inf")
)[:2]
EDITIONS = [pytest.param(s, None, id=s) for s in STEMS] + [
    pytest.param(s, ZH, id=f"{ZH}/{s}") for s in QUICKEST
]
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
    dirty = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and (c.outputs or c.execution_count)
    ]
    assert not dirty, f"{stem}: cells {dirty} have stored outputs; clear them before committing"


@pytest.mark.parametrize("stem", STEMS)
def test_no_cell_is_allowed_to_fail(stem):
    """papermill 2.x fails a run on any error output, tag or not: nothing may rely on the tag."""
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    tagged = [i for i, c in enumerate(nb.cells) if "raises-exception" in c.metadata.get("tags", [])]
    assert not tagged, f"{stem}: cells {tagged} tagged raises-exception; catch and print instead"


@pytest.mark.parametrize("stem", STEMS)
def test_reads_no_earlier_run(stem):
    """What a lesson shows comes from its own run, never from runs/latest of some other day."""
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    readers = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code" and re.search(r"""runs/latest|["']latest["']""", c.source)
    ]
    assert not readers, f"{stem}: cells {readers} read an earlier run's record"


def assigned_names(source: str) -> list[str]:
    return [
        t.id
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    ]


@pytest.mark.parametrize("stem", STEMS)
def test_parameters_are_checked_before_anything_runs(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    check = nb.cells[at + 2]  # after the sentence saying why
    assert check.cell_type == "code" and "params.check(" in check.source, "check cell moved"
    assert f'params.use_run_folder("{stem}", out_dir)' in check.source
    call = next(
        n
        for n in ast.walk(ast.parse(check.source))
        if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "check"
    )
    declared = set(assigned_names(nb.cells[at].source)) - {"out_dir", "quick"}
    assert {k.arg for k in call.keywords} == declared, "every parameter gets a kind"


def papermill(stem: str, out: Path, *params: str) -> subprocess.CompletedProcess:
    """papermill's own command line, as a user or a scheduler types it."""
    argv = [
        sys.executable,
        "-m",
        "papermill",
        f"{stem}.ipynb",
        str(out / f"{stem}.ipynb"),
        "-p",
        "out_dir",
        str(out),
        *params,
    ]
    return subprocess.run(argv, cwd=runner.NOTEBOOKS, capture_output=True, text=True, timeout=300)


@pytest.mark.notebook
@pytest.mark.parametrize(
    ("params", "message"),
    [
        (("-p", "quick", "yes"), "parameter quick must be True or False, got 'yes' (str)"),
        (
            ("-p", "quick", "True", "-p", "epochs", "0"),
            "unknown parameter(s) epochs: this notebook accepts out_dir, quick",
        ),
    ],
)
def test_bad_parameters_stop_at_the_check_cell(tmp_path, params, message):
    proc = papermill("00_environment", tmp_path, *params)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    executed = nbformat.read(tmp_path / "00_environment.ipynb", as_version=4)
    failed = [
        c for c in executed.cells if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert len(failed) == 1 and "params.check(" in failed[0].source
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.notebook
def test_nbconvert_runs_a_lesson_as_is(tmp_path):
    """`jupyter nbconvert --execute` (no parameter injection): the parameters cell is edited."""
    nb = nbformat.read(runner.NOTEBOOKS / "00_environment.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    out_dir = f"out_dir = {str(tmp_path / 'out')!r}"
    cell.source = re.sub(r"(?m)^quick = .*$", "quick = True", cell.source)  # the rest stays
    cell.source = re.sub(r"(?m)^out_dir = .*$", lambda _: out_dir, cell.source)
    nbformat.write(nb, tmp_path / "00_environment.ipynb")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "00_environment.ipynb",
            "--output",
            "executed",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    executed = nbformat.read(tmp_path / "executed.ipynb", as_version=4)
    errors = [
        c for c in executed.cells if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert not errors
    assert record_complete(tmp_path / "out" / "metrics.json")


def record_complete(path: Path) -> bool:
    from helpers import record

    rec = record.load(path)
    return rec["params"]["quick"] is True and bool(rec["metrics"])


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
@pytest.mark.parametrize(("stem", "lang"), EDITIONS)
def test_executes_headless_and_leaves_its_record(stem, lang, notebook_run, notebook_record):
    record = notebook_record(stem, lang)
    assert record["notebook"] == stem
    assert record["params"]["quick"] is True
    assert record["hardware"]["device"] in ("cpu", "cuda", "mps")
    assert record["seconds"] >= MIN_SECONDS, f"{stem} finished in {record['seconds']} s"
    for skip in record["skipped"]:
        assert skip["what"] and skip["why"], "every skip says what and why"
    executed = nbformat.read(notebook_run(stem, lang).output, as_version=4)
    unexecuted = [
        i
        for i, c in enumerate(executed.cells)
        if c.cell_type == "code" and c.execution_count is None
    ]
    assert not unexecuted, f"cells {unexecuted} of {stem} never ran"
    errors = [
        i
        for i, c in enumerate(executed.cells)
        if any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert not errors, f"cells {errors} of {stem} hold an error output"
    figures = list(Path(notebook_run(stem, lang).out_dir).glob("*.png"))
    assert figures, f"{stem} saved no figure next to metrics.json"
    json.dumps(record)  # plain JSON all the way down


@pytest.mark.notebook
@pytest.mark.parametrize(("stem", "lang"), EDITIONS)
def test_leaves_no_process_behind(stem, lang, notebook_run):
    outcome = notebook_run(stem, lang)
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
    """nbval in lax mode over papermill's executed notebook, its record sent to tmp_path.

    Only the cells up to the last checked one run again: a later cell cannot change a checked
    output, and the whole notebook already ran once (04 and 10 check an early cell: ~90 s less).
    """
    last = max(i for i, c in enumerate(executed.cells) if "NBVAL_CHECK_OUTPUT" in c.source)
    executed.cells = executed.cells[: last + 1]
    for cell in executed.cells:  # send the rerun's record elsewhere, keep quick mode
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.source = f"out_dir = {str(tmp_path / 'out')!r}\nquick = True\n"
    path = tmp_path / f"{stem}.ipynb"
    nbformat.write(executed, path)
    timeout = runner.catalog_entry(stem)["timeout_quick_s"]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval-lax",
            f"--nbval-kernel-name={runner.kernel_name()}",
            f"--nbval-cell-timeout={timeout}",
            f"--sanitize-with={SANITIZE}",
            "--rootdir",
            str(tmp_path),
            str(path),
        ],
        cwd=runner.NOTEBOOKS,
        capture_output=True,
        text=True,
        timeout=timeout + 120,
    )
