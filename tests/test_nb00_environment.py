"""Notebook 00: the record says what hardware was found and that the collective worked."""

from __future__ import annotations


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
