"""Notebook 11: ring attention (contiguous and zig-zag splits) equals full causal attention, with
the work per rank the splits predict; torch's context_parallel ran or says why not; expert
parallelism with all_to_all_single equals the one-process MoE, forward and gradients."""

from __future__ import annotations

import math

import predictions
import pytest

from helpers import cell_scripts, launch

STEM = "11_context_and_expert_parallel"
TOLERANCE = 1e-5  # float rounding of a different summation order; measured ~3e-7 on CPU


def test_ring_attention_equals_full_causal_attention(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["world_size"] >= 2 and m["backend"] in {"gloo", "nccl"}
    assert 0 <= m["max_diff_ring_attention_vs_full"] <= TOLERANCE
    assert 0 <= m["max_diff_zigzag_vs_full"] <= TOLERANCE


def test_the_zigzag_split_evens_the_causal_work(notebook_record):
    """Contiguous: rank r computes r + 1 blocks of (L/n)^2 scores; zig-zag: every rank computes
    2n + 1 blocks of (L/2n)^2, counted by the job itself."""
    record = notebook_record(STEM)
    m, length = record["metrics"], record["params"]["seq_len"]
    n = m["world_size"]
    work = m["work_per_rank"]
    assert work["contiguous"] == [(r + 1) * (length // n) ** 2 for r in range(n)]
    assert work["zigzag"] == [(2 * n + 1) * (length // (2 * n)) ** 2] * n
    assert max(work["zigzag"]) < max(work["contiguous"])


def test_torch_context_parallel_ran_or_was_skipped_with_the_error(notebook_record):
    record = notebook_record(STEM)
    diff = record["metrics"]["max_diff_torch_cp_vs_full"]
    skips = {s["what"]: s["why"] for s in record["skipped"]}
    if diff is None:
        why = skips["torch's context_parallel"]
        assert "Error" in why, "the skip gives the error the job measured"
        if record["hardware"]["worker_device"] == "cpu":  # measured with torch 2.14 on gloo
            assert "NotImplementedError" in why and "cpu" in why
    else:
        assert 0 <= diff <= TOLERANCE
        assert "torch's context_parallel" not in skips


def test_expert_parallel_equals_the_one_process_moe(notebook_record):
    record = notebook_record(STEM)
    m, p = record["metrics"], record["params"]
    assert 0 <= m["max_diff_moe_ep_vs_single"] <= TOLERANCE
    assert 0 <= m["max_grad_diff_moe_ep_vs_single"] <= TOLERANCE
    per_expert = m["tokens_per_expert"]
    top_k = min(p["top_k"], m["world_size"])
    assert len(per_expert) == m["world_size"]
    assert sum(per_expert) == m["world_size"] * p["tokens"] * top_k


def test_the_capacity_trade_off_comes_from_the_measured_routing(notebook_record):
    m = notebook_record(STEM)["metrics"]
    loads, n = m["tokens_per_expert"], m["world_size"]
    rows = sum(loads)
    for f, dropped, padding in zip(
        m["capacity_factors"], m["dropped_fraction"], m["padding_fraction"], strict=True
    ):
        c = math.ceil(f * rows / n)
        assert dropped == pytest.approx(sum(max(x - c, 0) for x in loads) / rows)
        assert padding == pytest.approx(sum(max(c - x, 0) for x in loads) / (c * n))
    assert m["dropped_fraction"] == sorted(m["dropped_fraction"], reverse=True)
    assert m["padding_fraction"] == sorted(m["padding_fraction"])


def test_the_first_script_is_the_core_alone():
    """Issue 32: the first script shows the ring (isend/irecv, the online softmax), <= 60 lines."""
    core = cell_scripts.cell_script(STEM, "work/cp_ring.py")
    assert sum(1 for line in core.splitlines() if line.strip()) <= 60
    assert "dist.isend" in core and "dist.irecv" in core and "torch.exp(m - m_new)" in core
    for script in ("work/cp_zigzag.py", "work/torch_cp.py", "work/moe_ep.py"):
        assert "from cp_ring import" in cell_scripts.cell_script(STEM, script)
    assert "all_to_all_single" in cell_scripts.cell_script(STEM, "work/moe_ep.py")


def test_the_exercises_change_the_ring_and_the_routing_and_pass(notebook_record):
    """11.1 drops the online softmax's rescale (chunk 0 right, the last wrong), 11.2 routes top-2
    (twice the rows through all_to_all_single, still equal to one process)."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"11.1": True, "11.2": True}


def test_ring_and_experts_hold_on_three_ranks(tmp_path, no_orphans):
    """An odd ring (3 ranks, zig-zag over 6 chunks) and 3 experts with top-2 routing."""
    for script in ("work/cp_ring.py", "work/cp_zigzag.py", "work/moe_ep.py"):
        cell_scripts.ensure_script(STEM, script, cwd=tmp_path)
    cell_scripts.ensure_script("09_tensor_parallel", "work/tp_core.py", cwd=tmp_path)  # setup()
    job = {"nproc": 3, "device": "cpu", "out_dir": tmp_path, "timeout": 300}
    splits = launch.torchrun(tmp_path / "work/cp_zigzag.py", ["192"], **job)
    for rank in range(3):
        out = splits.rank(rank)
        assert max(out["contiguous"]["max_diff"], out["zigzag"]["max_diff"]) <= TOLERANCE
        assert out["contiguous"]["work"] == (rank + 1) * 64**2
        assert out["zigzag"]["work"] == 7 * 32**2
    moe = launch.torchrun(tmp_path / "work/moe_ep.py", ["96", "2"], **job)
    for rank in range(3):
        out = moe.rank(rank)
        assert max(out["max_diff"], out["max_grad_diff"]) <= TOLERANCE
        assert out["rows_sent"] == 192 and sum(out["tokens_per_expert"]) == 192


def test_the_exercises_sit_in_their_sections_and_check_the_prediction():
    """11.1 at the end of section 1 (the ring), 11.2 at the end of section 4 (expert
    parallel): each check passes with the solution's predictions and fails with a wrong one;
    nothing launched."""
    ranks = {r: {"chunk_diffs": [3e-8, 0.4, 0.6]} for r in range(3)}
    wrong = {"predicted_right_chunks": [0, 1, 2]}
    predictions.assert_checked(STEM, "11.1", "## 1.", ranks, wrong)
    ranks = {r: {"rows_sent": 1024, "max_diff": 6e-8} for r in (0, 1)}
    wrong = {"predicted_rows_sent": 512, "predicted_equal_to_one_process": False}
    predictions.assert_checked(STEM, "11.2", "## 4.", ranks, wrong, {"tokens": 512})
