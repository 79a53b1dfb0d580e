"""Notebook 00: the record says what hardware was found and that the collective worked."""

from __future__ import annotations

import pytest

from helpers.record import load
from labtools import runner


def test_collective_ran_on_every_worker(notebook_record):
    record = notebook_record("00_environment")
    m = record["metrics"]
    hw = record["hardware"]
    assert m["gpu_count"] == hw["gpu_count"]
    assert m["backend"] == ("nccl" if hw["gpu_count"] else "gloo")
    assert m["world_size"] == hw["nproc"]
    assert m["allreduce_ok"] is True
    assert 0 < m["allreduce_seconds"] < 1.0
    assert m["cuda_available"] is (hw["gpu_count"] > 0)
    assert m["doctor_failures"] == []
    assert record["hardware"]["lesson_plan"]["nproc"] == m["world_size"]
    if m["world_size"] > 1:
        assert m["allreduce_busbw_gbps"] > 0


@pytest.mark.notebook
def test_one_rank_runs_and_skips_bus_bandwidth_with_the_reason(tmp_path):
    """What a 1-GPU machine does (one NCCL rank), on CPU with world_size = 1."""
    outcome = runner.execute(
        "00_environment", tmp_path, quick=True, params=["-p", "world_size", "1"]
    )
    assert outcome.status == "ok", outcome.error
    rec = load(tmp_path)
    m = rec["metrics"]
    assert m["world_size"] == 1 and m["allreduce_ok"] is True
    assert m["allreduce_busbw_gbps"] is None
    skipped = {s["what"]: s["why"] for s in rec["skipped"]}
    assert "no bandwidth to measure" in skipped["all_reduce bus bandwidth"]


def test_exercise_predictions_match_what_the_ranks_wrote(notebook_record):
    """Issue 44: 00.1 (ReduceOp.MAX) and 00.2 (all_reduce as an all-gather) sit in section 4;
    each check compares the solution's prediction with the values its job's ranks wrote."""
    exercises = notebook_record("00_environment")["metrics"]["exercises"]
    assert exercises == {"00.1": True, "00.2": True}
