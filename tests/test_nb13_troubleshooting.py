"""Notebook 13: every failure it claims was really provoked, the hang became an error in time,
and nothing it started is still running."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from pathlib import Path

import nbformat
import pytest

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
from labtools import runner

STEM = "13_troubleshooting"

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
NEEDS_CUDA = {
    "cuda_reinit_after_fork": r"ChildFailed: .*re-initialize CUDA in forked subprocess",
    # two ranks on one GPU: NCCL up to 2.29 says the first, 2.30 and later the second
    "nccl_duplicate_gpu": r"ChildFailed: .*(Duplicate GPU detected|Multiple Ranks are using the)",
}


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
    # ... and the collective itself raised at its timeout, in rank 0's Python: gloo's do by
    # themselves, NCCL's because the notebook sets TORCH_NCCL_BLOCKING_WAIT=1
    assert raised_after is not None, "rank 0 was ended from outside instead of raising"
    assert timeout - 0.5 <= raised_after <= m["hang_detected_seconds"]


def test_the_hang_runs_with_nccl_and_blocking_wait_whenever_two_gpus_are_visible(
    notebook_run, notebook_record
):
    record = notebook_record(STEM)
    m, gpus = record["metrics"], record["hardware"]["gpu_count"]
    skipped = {s["what"]: s["why"] for s in record["skipped"]}
    assert m["hang_backend"] == ("nccl" if gpus >= 2 else "gloo")
    if gpus >= 2:
        assert "hung_collective_nccl" not in m["cases"]
    else:
        assert m["cases"]["hung_collective_nccl"].startswith("skipped: ")
        why = skipped["hung_collective_nccl"]
        assert f"needs 2+ NVIDIA GPUs, one per NCCL rank (found {gpus})" in why
        assert ("one GPU cannot hold two NCCL ranks" in why) == (gpus == 1)
    # the launch command the cell printed sets TORCH_NCCL_BLOCKING_WAIT only for NCCL
    executed = nbformat.read(notebook_run(STEM).output, as_version=4)
    (hang_cell,) = [
        c for c in executed.cells if '"hung_collective", launch.WorkerFailed' in c.source
    ]
    printed = "".join(o.get("text", "") for o in hang_cell.outputs if o.output_type == "stream")
    command = next(ln for ln in printed.splitlines() if ln.startswith("$ "))
    assert ("TORCH_NCCL_BLOCKING_WAIT=1" in command) == (m["hang_backend"] == "nccl"), command


def test_the_crash_is_traced_to_the_rank_that_raised(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["crash_root_cause_rank"] == 1
    assert m["healthy_sums_ok"] is True


def test_nccl_set_up_failures_are_reproduced_on_gpus_or_skipped_with_their_reason(notebook_record):
    record = notebook_record(STEM)
    m, gpus = record["metrics"], record["hardware"]["gpu_count"]
    skipped = {s["what"]: s["why"] for s in record["skipped"]}
    if gpus:  # both ranks computed on cuda:0, and NCCL's own lines were kept
        assert m["cuda0_weights_on"] == ["cuda:0", "cuda:0"], m["cuda0_weights_on"]
        assert any(re.search(r"WARN .*(Duplicate GPU|same GPU)", ln) for ln in m["nccl_info_lines"])
    else:
        assert m["cuda0_weights_on"] == [] and m["nccl_info_lines"] == []
    assert "explained, not reproduced" in skipped["nccl_unhandled_system_error"]


def test_torch_load_puts_tensors_back_where_they_were_saved_unless_mapped(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["load_stored_tag"] == "cpu"
    assert m["load_plain_device"] == "cpu"
    assert m["load_mapped_device"] == "meta"


def test_rank0_alone_holds_the_predictions_it_gathers(notebook_record):
    record = notebook_record(STEM)
    m, gpus = record["metrics"], record["hardware"]["gpu_count"]
    on_gpus = "torch.cuda.max_memory_allocated"
    assert m["skew_measure"] == (on_gpus if gpus >= 2 else "peak resident memory")
    gathered = m["skew_gathered_mib"]
    peaks = m["skew_peak_mib"]
    fixed, gathering = peaks["all_reduce_metric"], peaks["gather_to_rank0"]
    assert len(fixed) == len(gathering) >= 2
    assert gathered == 64 * len(fixed)  # every rank's 4096 x 4096 float32 predictions
    # scoring where the predictions are keeps the ranks even ...
    assert max(fixed) - min(fixed) <= gathered / 4, fixed
    # ... gathering them puts at least all of them on rank 0 alone (gloo stages them once more)
    assert m["skew_rank0_extra_mib"] == pytest.approx(gathering[0] - max(gathering[1:]), abs=0.2)
    assert m["skew_rank0_extra_mib"] >= 0.9 * gathered, gathering


def test_notebook_launcher_fails_after_cuda_on_gpus_and_says_why_elsewhere(notebook_record):
    record = notebook_record(STEM)
    m, gpus = record["metrics"], record["hardware"]["gpu_count"]
    outcome = m["cases"]["notebook_launcher_after_cuda"]
    installed = importlib.util.find_spec("accelerate") is not None
    if installed:  # the lesson's cause: the installed Accelerate forks for CUDA
        assert any('"fork"' in ln for ln in m["notebook_launcher_start_lines"])
    if gpus and installed:
        assert outcome == "reproduced", outcome
        error = m["case_errors"]["notebook_launcher_after_cuda"]
        assert re.search(r"re-initialize CUDA in forked subprocess|CUDA has been initiali", error)
    else:
        assert outcome.startswith("skipped: ")
        assert ("GPU" if installed else "Accelerate is not installed") in outcome


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


def test_the_exercises_diagnose_jobs_and_pass(notebook_run, notebook_record):
    """13.1 predicts the rank DETAIL reports absent; 13.2 predicts the leaking job exits 0 and
    ends what it left behind."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"13.1": True, "13.2": True}
    executed = nbformat.read(notebook_run(STEM).output, as_version=4)
    (detail_cell,) = [c for c in executed.cells if "def run_with_detail" in c.source]
    printed = "".join(o.get("text", "") for o in detail_cell.outputs if o.output_type == "stream")
    assert re.search(r"Ranks? 1 failed to pass monitoredBarrier", printed), printed


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
