"""Notebook 07 (memory and ZeRO): each equality holds, each saving is measured, what needs a
GPU ran or was skipped with its reason."""

from __future__ import annotations

import math
from pathlib import Path

STEM = "07_memory_and_zero"
TOLERANCE = 1e-5  # float rounding of another summation order (measured: below 1e-7 on CPU)


def skipped(record: dict) -> dict[str, str]:
    return {s["what"]: s["why"] for s in record["skipped"]}


def test_zero_shards_the_optimizer_state_and_changes_no_weight(notebook_record):
    m = notebook_record(STEM)["metrics"]
    adamw, zero = m["optimizer_state_bytes_per_rank"].values()
    assert sum(zero) == adamw[0]  # disjoint shares of one full copy of the state
    if m["world_size"] > 1:
        assert max(zero) < adamw[0]
    assert m["max_param_diff_zero_vs_adamw"] <= TOLERANCE


def test_activation_checkpointing_saves_memory_and_changes_no_gradient(notebook_record):
    record = notebook_record(STEM)
    m = record["metrics"]
    saved = m["activation_saved_bytes"]
    assert 0 < saved["checkpointed"] < saved["plain"] / 2
    assert math.isclose(m["activation_saved_ratio"], saved["checkpointed"] / saved["plain"])
    assert m["recompute_time_ratio"] > 0  # measured; its size is hardware, not a test
    assert m["max_grad_diff_checkpointed_vs_plain"] <= TOLERANCE
    peak = m["activation_peak_bytes"]
    if record["hardware"]["device"] == "cuda":
        assert peak["checkpointed"] < peak["plain"]
    else:
        assert peak == {"plain": None, "checkpointed": None}
        assert "GPU" in skipped(record)["activation checkpointing peak memory"]


def test_memory_view_ran_and_gpu_parts_ran_or_were_skipped(notebook_record, notebook_run):
    record = notebook_record(STEM)
    m = record["metrics"]
    assert m["profiler_memory_top_ops"] and all(
        op.startswith("aten::") for op in m["profiler_memory_top_ops"]
    )
    why = skipped(record)
    if record["hardware"]["device"] != "cuda":
        assert m["cuda_memory"] is None and m["expandable_segments"] is None
        for what in (
            "memory_allocated vs memory_reserved",
            "memory history snapshot",
            "out-of-memory reproduced",
            "expandable_segments",
        ):
            assert "GPU" in why[what], what
    elif "error" not in m["cuda_memory"]:
        assert "out of memory" in m["cuda_memory"]["oom"].lower()
        after = m["cuda_memory"]["after_del"]
        assert after["allocated"] <= after["reserved"]
        assert set(m["expandable_segments"]) == {"default", "expandable_segments"}
        # one snapshot file per rank: ranks writing one file at once would corrupt it
        out_dir = Path(notebook_run(STEM).out_dir)
        assert Path(m["cuda_memory"]["snapshot"]).name == "memory_snapshot_rank0.pickle"
        for r in range(m["world_size"]):
            assert (out_dir / f"memory_snapshot_rank{r}.pickle").stat().st_size > 0, r


def test_exercises_solved_in_the_answer_key(notebook_record):
    """07.1 runs ZeRO on one rank (all of AdamW's state), 07.2 reads the memory profile."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"07.1": True, "07.2": True}
