"""Notebook 02: DDP trains, equals one process on the global batch, and survives a crash."""

from __future__ import annotations

import pytest

STEM = "02_distributed_data_parallel"


def test_ddp_equals_single_process_and_learns(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["max_param_diff_vs_single"] <= 1e-5
    assert m["accuracy"] >= 0.90
    if m["dataset"] == "mnist":
        assert abs(m["accuracy"] - m["accuracy_single"]) <= 0.02


def test_scaling_compares_one_device_with_the_same_threads(notebook_record):
    """One process with one rank's share of the cores against N ranks; never 1.0 by construction."""
    record = notebook_record(STEM)
    m = record["metrics"]
    if m["world_size"] == 1:
        assert m["scaling_efficiency"] is None
        assert any(s["what"] == "scaling" for s in record["skipped"])
        return
    assert m["threads_single"] == m["threads_per_rank"] >= 1
    assert m["samples_per_s_single"] > 0 and m["samples_per_s_ddp"] > 0
    speedup = m["samples_per_s_ddp"] / m["samples_per_s_single"]
    assert m["scaling_speedup"] == pytest.approx(speedup)
    assert m["scaling_efficiency"] == pytest.approx(speedup / m["world_size"])


def test_accumulated_micro_batches_do_not_all_reduce(notebook_record):
    """Counted by the script's comm hook: no_sync() around forward and backward skips them."""
    m = notebook_record(STEM)["metrics"]
    assert m["allreduces_in_no_sync_micro_batches"] == 0
    per_step = m["allreduces_per_step"]
    assert per_step["accum_1"] >= 1  # the hook really counted
    assert per_step["accum_4"] == per_step["accum_1"]  # one all-reduce per bucket per step


def test_restart_resumes_and_matches_the_uninterrupted_run(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["resumed_after_failure"] is True
    assert abs(m["accuracy_after_restart"] - m["accuracy"]) <= 0.01


def test_mp_spawn_from_the_notebook_really_failed(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert "Process" in m["mp_spawn_error"] or "Error" in m["mp_spawn_error"]


def test_every_demo_has_two_ranks_at_least_and_the_plan_is_recorded(notebook_record):
    """On one GPU the plan is 2 CPU ranks (tests/test_device_plan.py): rank 1 exists to be
    killed, and DDP is compared with one process, never with a run of itself."""
    record = notebook_record(STEM)
    m, plan = record["metrics"], record["hardware"]["lesson_plan"]
    assert plan["nproc"] == m["world_size"] >= 2
    assert plan["backend"] == m["backend"] and plan["why"]
    assert m["resumed_after_failure"] is True


def test_exercise_solutions_pass_from_the_jobs_own_output(notebook_record):
    """Issue 44: 02.1 (no set_epoch: does epoch 1 start with epoch 0's samples?) ends section 1
    and 02.2 (the step the restart resumes from, predicted before section 6's job runs) is
    checked right after that job; each compares the solution's prediction with what the
    ranks wrote, and the solutions pass."""
    exercises = notebook_record(STEM)["metrics"]["exercises"]
    assert exercises == {"02.1": True, "02.2": True}


def test_global_batch_and_learning_rate_against_one_process(notebook_record):
    """Section 4: keeping the global batch is one process's training (to 1e-5); keeping the
    per-rank batch takes fewer, larger steps and, at the same learning rate, trains differently."""
    m = notebook_record(STEM)["metrics"]
    gaps, steps = m["lr_scaling_max_loss_gap"], m["lr_scaling_steps"]
    assert 0 <= gaps["same_global"] <= 1e-5
    assert gaps["same_per_rank"] > 1e-5
    assert steps["same_global"] == steps["one_process"]
    assert steps["same_per_rank"] == steps["scaled_lr"] < steps["one_process"]
    assert m["lr_scaling_scaled_closer"] == (gaps["scaled_lr"] < gaps["same_per_rank"])
