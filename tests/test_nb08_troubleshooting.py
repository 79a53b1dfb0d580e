"""Notebook 08: every failure it claims was really provoked, the hang became an error in time,
and nothing it started is still running."""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import runner
from helpers.troubleshoot import (
    Cases,
    ChildFailed,
    ChildTimeout,
    NotReproduced,
    describe,
    port_owners,
    processes_matching,
    run_fresh,
)

STEM = "08_troubleshooting"

# case -> the error (type: text) its reproduction must have raised, on any hardware
REPRODUCED_EVERYWHERE = {
    "device_mismatch": r"(RuntimeError|ChildFailed): .*device",
    "port_in_use": r"ChildFailed: .*EADDRINUSE",
    "port_refused_by_launcher": r"^PortInUse: Port \d+ is already in use",
    "mp_spawn_notebook_function": r"ProcessExitedException: process 0 terminated with exit code",
    "fork_after_torch_hang": r"ChildFailed: TimeoutError: the forked child did not finish",
    "hung_collective": r"WorkerFailed: .*(Timed out|monitoredBarrier|[Ww]atchdog)",
    "rank_crash": r"WorkerFailed: .*ValueError: rank 1 found a bad batch",
    "orphaned_worker": r"^PortInUse: Port \d+ is already in use",
}
NEEDS_CUDA = {"cuda_reinit_after_fork": r"ChildFailed: .*re-initialize CUDA in forked subprocess"}


def test_every_cpu_reproducible_case_raised_the_error_it_was_meant_to(notebook_record):
    m = notebook_record(STEM)["metrics"]
    for case, pattern in REPRODUCED_EVERYWHERE.items():
        assert m["cases"].get(case) == "reproduced", f"{case}: {m['cases'].get(case)}"
        assert re.search(pattern, m["case_errors"][case]), f"{case}: {m['case_errors'][case]}"
    assert m["cases_reproduced"] == sum(v == "reproduced" for v in m["cases"].values())
    assert m["cases_reproduced"] >= len(REPRODUCED_EVERYWHERE)


def test_dev_shm_case_is_reproduced_or_skipped_with_its_reason(notebook_record):
    m = notebook_record(STEM)["metrics"]
    outcome = m["cases"]["dev_shm_too_small"]
    if outcome == "reproduced":
        assert re.search(r"(?i)shared memory|bus error", m["case_errors"]["dev_shm_too_small"])
    else:
        assert outcome.startswith("skipped: ") and len(outcome) > len("skipped: ") + 10


def test_cuda_cases_reproduced_on_gpus_and_skipped_with_a_reason_elsewhere(notebook_record):
    record = notebook_record(STEM)
    m, gpus = record["metrics"], record["hardware"]["gpu_count"]
    skipped = {s["what"]: s["why"] for s in record["skipped"]}
    for case, pattern in NEEDS_CUDA.items():
        if gpus:
            assert m["cases"][case] == "reproduced", m["cases"][case]
            assert re.search(pattern, m["case_errors"][case])
        else:
            assert m["cases"][case].startswith("skipped: ") and "GPU" in m["cases"][case]
            assert "GPU" in skipped[case]
    p2p = m["cases"]["nccl_p2p_hang"]  # never reproducible on demand: explained, with a reason
    assert p2p.startswith("skipped: ") and "nccl_p2p_hang" in skipped


def test_the_hung_collective_ended_within_its_timeout(notebook_record):
    m = notebook_record(STEM)["metrics"]
    timeout = m["hang_timeout_seconds"]
    raised_after = m["hang_collective_raised_after_seconds"]
    # the whole job was over, every rank stopped, within timeout + 15 s ...
    assert timeout - 0.5 <= m["hang_detected_seconds"] <= timeout + 15
    # ... and the collective itself gave up at its timeout (always on gloo; NCCL may instead
    # have its watchdog end the process, which leaves no time to note)
    if raised_after is not None or not notebook_record(STEM)["hardware"]["gpu_count"]:
        assert timeout - 0.5 <= raised_after <= m["hang_detected_seconds"]


def test_the_crash_is_traced_to_the_rank_that_raised(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["crash_root_cause_rank"] == 1
    assert m["healthy_sums_ok"] is True


def test_no_process_left_behind(notebook_run, notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["orphan_freed"] is True
    assert m["leftover_processes"] == []
    # after the kernel is gone: no worker, forked child or orphan of the notebook's scripts that
    # carries this run's marker (the same lesson run by someone else on this machine is theirs)
    this_run = str(Path(notebook_run(STEM).out_dir).resolve())
    assert processes_matching("work/trouble_", run=this_run) == []
    assert runner.leftover_processes(notebook_run(STEM).out_dir) == []


def test_each_reproduction_cell_shows_its_traceback_or_why_it_was_skipped(notebook_run):
    executed = nbformat.read(notebook_run(STEM).output, as_version=4)
    repro = [c for c in executed.cells if c.cell_type == "code" and "cases.expect(" in c.source]
    assert len(repro) >= len(REPRODUCED_EVERYWHERE) + len(NEEDS_CUDA)
    for cell in repro:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source[:80]
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "Traceback" in text or "SKIPPED" in text, cell.source[:80]


# ---- the lesson's plumbing (helpers.troubleshoot), without running the notebook


def test_expect_records_the_expected_error_and_lets_the_lesson_go_on(capsys):
    cases = Cases()
    with cases.expect("zero", ZeroDivisionError, match="division"):
        1 / 0  # noqa: B018
    assert cases.outcomes["zero"] == "reproduced" and cases.reproduced == 1
    assert cases.errors["zero"].startswith("ZeroDivisionError: ")
    assert "Traceback" in capsys.readouterr().err  # the reader sees the real traceback


def test_expect_fails_loudly_when_the_lesson_claims_too_much():
    cases = Cases()
    with pytest.raises(NotReproduced):
        with cases.expect("nothing", ValueError):
            pass
    with pytest.raises(ValueError):
        with cases.expect("other text", ValueError, match="EADDRINUSE"):
            raise ValueError("something else")
    with pytest.raises(KeyError):
        with cases.expect("other type", ValueError):
            raise KeyError("x")
    assert cases.reproduced == 0
    assert cases.outcomes["nothing"].startswith("not reproduced")
    assert cases.outcomes["other text"].startswith("unexpected: ValueError")
    assert cases.outcomes["other type"].startswith("unexpected: KeyError")


def test_run_fresh_reports_the_childs_error_and_ends_what_runs_too_long(no_orphans):
    with pytest.raises(ChildFailed, match="ValueError: from the child"):
        run_fresh([sys.executable, "-c", "raise ValueError('from the child')"], timeout=60)
    sleeper = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "time.sleep(60)",
    ]
    with pytest.raises(ChildTimeout):
        run_fresh(sleeper, timeout=2)


def test_port_owners_finds_the_process_holding_a_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        assert os.getpid() in port_owners(held.getsockname()[1])
    assert describe(os.getpid())["uid"] == os.getuid()
