"""The runner behind `make run`: parameters, run folders and the summary table."""

from __future__ import annotations

import json
import sys

import pytest

from helpers.launch import JOB_RECORD
from labtools import ledger, run_folder, runner


def test_params_are_papermill_pairs():
    assert runner.parse_params("-p epochs 3 -p lr 0.1") == ["-p", "epochs", "3", "-p", "lr", "0.1"]
    assert runner.parse_params("") == []
    with pytest.raises(ValueError, match="-p NAME VALUE"):
        runner.parse_params("epochs=3")


def test_run_dir_is_linked_as_latest(tmp_path):
    first = run_folder.new_run_dir(tmp_path)
    assert (tmp_path / "latest").resolve() == first.resolve()


def test_summary_table_shows_key_metrics_and_errors(tmp_path):
    out = tmp_path / "00_environment"
    out.mkdir()
    metrics = {"backend": "gloo", "world_size": 2, "allreduce_ok": True, "allreduce_seconds": 0.5}
    (out / "metrics.json").write_text(json.dumps({"metrics": metrics, "skipped": [{}]}))
    ok = runner.Outcome("00_environment", "ok", 12.3, "x.ipynb", str(out), None, 2, 14.6)
    bad = runner.Outcome("00_environment", "failed", 1.0, "y.ipynb", str(tmp_path), "Boom")
    table = runner.summary_table([ok, bad])
    assert "backend=gloo" in table and "allreduce_seconds=0.5" in table
    assert "00_environment failed:\nBoom" in table
    header, first, second = table.splitlines()[:3]
    assert "torchrun jobs" in header and "2 in 15 s" in first and " - " in second


def test_a_notebooks_jobs_are_counted_from_their_records_afresh_each_run(tmp_path):
    """Each job leaves job.json in its own folder under the run folder; the runner reads them
    from outside and removes an earlier run's before the next."""
    assert ledger.read(tmp_path) == []
    for name, started, seconds in (("a", 100.0, 6.25), ("b", 110.0, 8.5)):
        (tmp_path / "work" / name).mkdir(parents=True)
        job = {"started": started, "seconds": seconds, "nproc": 2}
        (tmp_path / "work" / name / JOB_RECORD).write_text(json.dumps(job))
    (tmp_path / "work" / "torn").mkdir()
    (tmp_path / "work" / "torn" / JOB_RECORD).write_text('{"started": 1')  # killed mid-write
    assert runner.finished("02", 0.0, tmp_path / "02.ipynb", tmp_path, None).launches == 2
    assert ledger.totals(ledger.read(tmp_path)) == (2, 14.75)
    code, _ = runner.run_marked([sys.executable, "-c", "pass"], tmp_path, timeout=60)
    assert code == 0 and ledger.read(tmp_path) == []  # a new run starts with no records


def test_jobs_at_the_same_time_count_once_with_their_largest_size():
    jobs = [
        {"started": 100.0, "seconds": 10.0, "nproc": 1},  # notebook 14: two agents at once
        {"started": 101.0, "seconds": 12.0, "nproc": 1},
        {"started": 120.0, "seconds": 5.0, "nproc": 2},  # then a job of its own
    ]
    assert ledger.groups(list(reversed(jobs))) == [(13.0, 1), (5.0, 2)]


def test_unknown_notebook_names_the_catalog():
    with pytest.raises(KeyError, match="catalog.json"):
        runner.catalog_entry("99_nope")


def test_a_failure_names_the_cell_that_raised(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("ok()"), nbformat.v4.new_code_cell("boom()")]
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="boom")]
    nbformat.write(nb, tmp_path / "nb.ipynb")
    report = runner.failure_report(tmp_path / "nb.ipynb", "papermill log")
    assert report == "cell 1 raised NameError: boom\npapermill log"
    assert runner.failure_report(tmp_path / "missing.ipynb", "last\nlines") == "last\nlines"


def test_leftover_processes_finds_only_this_runs_marker(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, runner.RUN_MARKER: str(tmp_path.resolve())}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert runner.leftover_processes(tmp_path) == [proc.pid]
        assert runner.leftover_processes(tmp_path / "other") == []
    finally:
        proc.kill()
        proc.wait()
    assert runner.leftover_processes(tmp_path) == []


def test_baseline_latest_means_the_run_before_this_one(tmp_path, monkeypatch):
    """`make run BASELINE=runs/latest` must compare with the previous run, not with itself."""
    root = tmp_path / "runs"
    previous = run_folder.new_run_dir(root)
    seen = {}

    def compare_with(base, new):
        seen.update(base=base, new=new)
        return 0

    monkeypatch.setattr(runner, "run_all", lambda stems, run_dir, quick, params, lang=None: [])
    monkeypatch.setattr(runner, "compare_with", compare_with)
    monkeypatch.setattr(run_folder.time, "strftime", lambda fmt: "20991231-235959")
    assert runner.main(["--runs", str(root), "--baseline", str(root / "latest")]) == 0
    assert seen["base"] == previous.resolve()
    assert seen["new"].name == "20991231-235959"


def test_a_baseline_that_cannot_be_read_is_exit_code_2(tmp_path, capsys):
    run_dir = run_folder.new_run_dir(tmp_path / "runs")
    assert runner.compare_with(tmp_path / "no-such-run", run_dir) == 2
    assert "not a run directory" in capsys.readouterr().err
