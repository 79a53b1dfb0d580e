"""Notebook 07 (memory and ZeRO): each equality holds, each saving is measured, what needs a
GPU ran or was skipped with its reason."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib.pyplot  # noqa: F401  imported by 07's plan cell: paid at collection
import pytest

from helpers import arithmetic, env, exercise, launch  # noqa: F401  as matplotlib above
from helpers.paths import NOTEBOOKS

STEM = "07_memory_and_zero"
TOLERANCE = 1e-5  # float rounding of another summation order (measured: below 1e-7 on CPU)


def skipped(record: dict) -> dict[str, str]:
    return {s["what"]: s["why"] for s in record["skipped"]}


def test_where_the_bytes_go_formulas_meet_torchs_memtracker(notebook_record):
    """Section 1: 16 bytes per parameter with AdamW (+4 per tensor: Adam's step), DDP's
    buckets a second copy of the gradients, TinyNet's activations by the block formula; each
    term set beside torch's MemTracker. Exact on CPU (the tracker counts tensor bytes); on a
    GPU it rounds each tensor up to an allocator block, and the allocator's counters are read."""
    record = notebook_record(STEM)
    m = record["metrics"]
    n, predicted, measured = (
        m["parameters"],
        m["bytes_per_rank_formula"],
        m["bytes_per_rank_measured"],
    )
    terms = {"weights", "gradients", "DDP's buckets", "Adam's moments", "activations"}
    assert set(predicted) == set(measured) == terms
    assert predicted["weights"] == predicted["gradients"] == predicted["DDP's buckets"] == 4 * n
    assert 8 * n < predicted["Adam's moments"] < 8 * n + 4 * n  # + a 4-byte step per tensor
    assert predicted["activations"] > 0
    error = max(abs(measured[k] - p) / p for k, p in predicted.items())
    assert m["bytes_prediction_error"] == pytest.approx(error)
    assert m["largest_bytes_term"] == max(measured, key=measured.get)
    if "memory_allocated beside MemTracker" in skipped(record):
        assert m["bytes_prediction_error"] == 0  # CPU: every term exactly as derived
        assert m["cuda_allocator_after_step"] is None
        assert "GPU" in skipped(record)["memory_allocated beside MemTracker"]
    else:
        assert m["bytes_prediction_error"] <= 0.05
        cuda = m["cuda_allocator_after_step"]
        assert sum(measured.values()) - measured["activations"] <= cuda["allocated"]
        assert cuda["allocated"] <= cuda["reserved"]


def test_zero_shards_the_optimizer_state_and_changes_no_weight(notebook_record):
    m = notebook_record(STEM)["metrics"]
    adamw, zero = m["optimizer_state_bytes_per_rank"].values()
    assert sum(zero) == adamw[0]  # disjoint shares of one full copy of the state
    if len(zero) > 1:  # section 4's ranks (sections 2-3 may run one process on one GPU)
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
    """Each checked against the learner's prediction: 07.1 doubles section 1's rows (the state
    unchanged, the activations as the formula says), 07.2 builds DDP with
    gradient_as_bucket_view=True (16 bytes per parameter, not 20), 07.3 runs ZeRO on one rank
    (all of AdamW's state)."""
    exercises = notebook_record(STEM)["metrics"]["exercises"]
    assert exercises == {"07.1": True, "07.2": True, "07.3": True}


def cell_source(cell_id: str) -> str:
    cells = json.loads((NOTEBOOKS / f"{STEM}.ipynb").read_text())["cells"]
    return "".join(next(c for c in cells if c["id"] == cell_id)["source"])


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_sections_1_3_and_4_run_one_process_on_one_gpu_and_zero_keeps_two_ranks(
    gpus, monkeypatch, capsys
):
    """Issue 41.3 on a faked inventory: notebook 07's own plan cell, executed with the lesson's
    plan, sends each part where the lesson says (nothing is launched)."""
    inventory = env.GPUInfo(
        "nvml", "999.1", [env.GPU(i, "NVIDIA H200", 141 << 30, 0, f"GPU-{i}") for i in range(gpus)]
    )
    monkeypatch.setattr(env, "gpu_info", lambda: inventory)
    min_ranks = int(re.search(r"min_ranks=(\d+)", cell_source("check-params"))[1])
    plan = env.device_plan(min_ranks=min_ranks)
    where = {}  # part -> (device, nproc) of its job

    class Launched(Exception):
        """Stops section 1's cell once its job is launched (nothing to read back here)."""

    def torchrun(script, args, **kw):
        if script == "work/bytes_held.py":
            where["bytes"] = (kw["device"], kw["nproc"])
            raise Launched
        where[args[args.index("--part") + 1]] = (kw["device"], kw["nproc"])

    monkeypatch.setattr(launch, "torchrun", torchrun)
    ns = {"plan": plan, "steps": 6, "global_batch": 64, "ac_batch": 2048}
    exec(cell_source("57051256"), ns)  # noqa: S102  the lesson's cell, as the kernel runs it
    with pytest.raises(Launched):
        exec(cell_source("bytes-run-07"), ns)  # noqa: S102  section 1's launch
    for part in ("memory", "ac", "zero"):
        ns["run_part"](part)
    one = ("cuda", gpus) if gpus else ("cpu", 2)
    assert where == {
        "bytes": one,
        "memory": one,
        "ac": one,
        "zero": ("cuda", gpus) if gpus >= 2 else ("cpu", 2),  # ZeRO shards over 2 ranks or more
    }
    said = capsys.readouterr().out
    if gpus == 1:  # the lesson's plan says 2 CPU processes; the line after it says why not here
        assert "Sections 1, 3 and 4: cuda -> 1 process, one per GPU (1 visible), with NCCL" in said
    else:
        assert "Sections 1, 3 and 4" not in said
