"""Notebook 10: the split and the pipeline compute what the unsplit model does."""

from __future__ import annotations

from pathlib import Path

import predictions
import pytest
import torch

from helpers import cell_scripts, launch
from helpers.env import GPU, GPUInfo
from helpers.models import SimpleCNN, parameter_bytes
from helpers.placement import stage_devices

STEM = "10_pipeline_parallel"
TOLERANCE = 1e-5  # float rounding of a different summation order; measured ~3e-8 on CPU


def test_split_model_equals_unsplit_and_learns(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert 0 <= m["max_output_diff_split_vs_single"] <= TOLERANCE
    assert 0 <= m["max_grad_diff_split_vs_single"] <= TOLERANCE
    assert m["accuracy_split_model"] >= 0.90


def test_pipeline_trains_like_the_unsplit_model(notebook_record):
    m = notebook_record(STEM)["metrics"]
    # weights after several SGD steps: micro-batches sum the gradient in another order and the
    # rounding compounds (5.6e-05 on synthetic data, 5.8e-07 on MNIST): the notebook's own 1e-4
    assert 0 <= m["max_param_diff_pipeline_vs_single"] <= 1e-4
    assert set(m["param_diff_by_schedule"]) == {"naive", "gpipe", "1f1b"}
    assert max(m["param_diff_by_schedule"].values()) == m["max_param_diff_pipeline_vs_single"]
    assert m["max_loss_diff_pipeline_vs_single"] <= 1e-5


def test_without_scale_grads_the_gradient_is_m_times_too_large(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert abs(m["grad_ratio_without_scale_grads"] - m["microbatches"]) <= 1e-4


def test_bubble_fraction_formula_and_simulation_agree(notebook_record):
    m = notebook_record(STEM)["metrics"]
    s, mb = m["stages"], m["microbatches"]
    expected = {
        "naive": (s - 1) / s,
        "gpipe": (s - 1) / (mb + s - 1),
        "1f1b": (s - 1) / (mb + s - 1),
    }
    assert m["bubble_fraction"] == pytest.approx(expected)
    assert m["bubble_fraction_simulated"] == pytest.approx(expected)
    in_flight = m["peak_microbatches_in_flight"]  # GPipe holds all M, 1F1B at most S - s
    assert in_flight["gpipe"] == [mb] * s
    assert in_flight["1f1b"] == [min(s - i, mb) for i in range(s)]


def test_memory_per_stage_adds_up_to_the_unsplit_model(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert len(m["param_bytes_per_stage"]) == m["stages"]
    assert sum(m["param_bytes_per_stage"]) == parameter_bytes(SimpleCNN())
    assert sum(m["memory_bytes_per_stage"]) == m["memory_bytes_unsplit"]
    # SGD with momentum: parameters, gradients and one buffer, all the same size
    assert m["memory_bytes_per_stage"] == [3 * b for b in m["param_bytes_per_stage"]]


def test_speed_is_measured_side_by_side(notebook_record):
    m = notebook_record(STEM)["metrics"]
    steps = m["pipeline_step_seconds"]
    assert set(steps) == {"naive", "gpipe", "1f1b"} and all(v > 0 for v in steps.values())
    for name in ("gpipe", "1f1b"):
        assert m["pipeline_speedup_vs_naive"][name] == pytest.approx(steps["naive"] / steps[name])
        assert m["predicted_speedup_vs_naive"][name] > 0


def test_split_and_timeline_say_what_ran(notebook_record):
    record = notebook_record(STEM)
    m, hw = record["metrics"], record["hardware"]
    skipped = {s["what"]: s["why"] for s in record["skipped"]}
    separate = hw["device"] == "cuda" and hw["gpu_count"] >= 2
    assert m["split_on_separate_devices"] is separate
    assert m["measured_timeline"] is separate
    if separate:
        assert m["split_devices"] == ["cuda:0", "cuda:1"] and not skipped
    else:
        assert m["split_devices"] == ["cpu", "cpu"]
        assert skipped["model split across 2 GPUs"]
        assert skipped["measured pipeline timeline"]


@pytest.mark.parametrize("script", ["work/pipeline_core.py", "work/pipeline_train.py"])
def test_script_file_is_the_notebook_cells(notebook_run, script):
    """The %%writefile cells make the scripts that ran, and helpers.cell_scripts rebuilds them."""
    written = (Path(notebook_run(STEM).out_dir) / script).read_text()
    assert written == cell_scripts.cell_script(STEM, script)


def test_the_first_script_is_the_core_alone():
    """Issue 32: the first script shows the pipelining API and nothing else, in <= 60 lines."""
    core = cell_scripts.cell_script(STEM, "work/pipeline_core.py")
    assert sum(1 for line in core.splitlines() if line.strip()) <= 60
    assert "PipelineStage" in core and ".step(" in core
    assert "from pipeline_core import" in cell_scripts.cell_script(STEM, "work/pipeline_train.py")


def test_the_exercises_run_pipeline_jobs_and_pass(notebook_record):
    assert notebook_record(STEM)["metrics"]["exercises"] == {"10.1": True, "10.2": True}


def test_traced_timeline_comes_from_its_own_run(tmp_path, no_orphans):
    """The GPU-only --trace path, run on CPU: the timeline is a separate two-step run (its
    syncs would distort the timed steps), and the timed runs still equal the unsplit model."""
    cell_scripts.ensure_script(STEM, "work/pipeline_core.py", cwd=tmp_path)  # it imports the core
    script = cell_scripts.ensure_script(STEM, "work/pipeline_train.py", cwd=tmp_path)
    argv = ["--steps", "3", "--microbatches", "4", "--trace"]  # CPU: the launcher hides GPUs
    result = launch.torchrun(script, argv, nproc=2, device="cpu", out_dir=tmp_path, timeout=300)
    for rank in (0, 1):
        out = result.rank(rank)
        assert set(out["step_seconds"]) == {"naive", "gpipe", "1f1b"}
        assert max(out["param_diff"].values()) <= TOLERANCE
        kept = {name: len(events) for name, events in out["timeline"].items()}
        assert kept == {"naive": 2, "gpipe": 8, "1f1b": 8}  # one step: M forwards, M backwards
        assert {event[0] for event in out["timeline"]["1f1b"]} == {"F", "B"}
        # activations held at once, read from the real schedule's order: GPipe all M, 1F1B S - s
        assert out["peak_held"] == {"naive": 1, "gpipe": 4, "1f1b": 2 - rank}
        assert out["equal_to_unsplit"] is True and out["microbatches"] == 4


def _gpus(n: int) -> GPUInfo:
    return GPUInfo("nvml", "999", [GPU(i, "Fake GPU", 80 << 30, 0) for i in range(n)])


@pytest.mark.parametrize("count", [0, 1])
def test_stage_devices_fall_back_to_cpu_and_say_why(count):
    placement = stage_devices(2, _gpus(count))
    assert placement.devices == [torch.device("cpu")] * 2
    assert not placement.separate
    assert "2 GPUs" in placement.reason and "CPU" in placement.reason


def test_stage_devices_use_one_gpu_per_stage_without_initialising_cuda():
    placement = stage_devices(2, _gpus(3))
    assert placement.devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert placement.separate and "cuda:1" in placement.reason
    assert not torch.cuda.is_initialized()
    with pytest.raises(ValueError):
        stage_devices(0, _gpus(0))


def test_a_published_gpu_figure_stands_beside_the_measured_one(notebook_record):
    """Issue 44: on a CPU the pipeline can be slower than the naive split; the lesson records
    a published 2-GPU measurement of the same comparison and says which case this run is."""
    record = notebook_record(STEM)
    m = record["metrics"]
    published = m["published_pipeline_speedup"]
    assert published["samples_per_s"] == {"m=1": 26.733, "m=4": 41.133, "m=32": 47.386}
    assert published["speedup"] == {"m=4": 1.539, "m=32": 1.773}
    assert "Tesla P40" in published["hardware"] and "fp32" in published["model"]
    assert "torchgpipe" in published["source"]
    assert published["url"].startswith("https://github.com/kakaobrain/torchgpipe/")
    verdict, gpipe = m["pp_verdict"], m["pipeline_speedup_vs_naive"]["gpipe"]
    way = "faster" if gpipe > 1 else "not faster"
    assert verdict.endswith(f"GPipe {gpipe:.2f}x the naive split, {way}")
    separate = record["hardware"]["device"] == "cuda" and record["hardware"]["gpu_count"] >= 2
    assert ("one GPU per stage" in verdict) is separate


def test_the_exercises_sit_in_their_sections_and_check_the_prediction():
    """10.1 at the end of section 3 (the schedules), 10.2 at the end of section 4 (equal to
    the unsplit model): each check passes with the solution's predictions and fails with a
    wrong one; nothing launched."""
    gpipe = [[None, None], [2.30, 2.10]]  # section 3's GPipe losses, rank 0 and rank 1
    ranks = {r: {"schedule": "Schedule1F1B", "losses": gpipe[r]} for r in (0, 1)}
    namespace = {"gpipe_runs": gpipe}
    wrong = {"predicted_same_losses": False}
    predictions.assert_checked(STEM, "10.1", "## 3.", ranks, wrong, namespace)
    held = [{"naive": 1, "gpipe": 8, "1f1b": 2}, {"naive": 1, "gpipe": 8, "1f1b": 1}]
    ranks = {r: {"microbatches": 8, "equal_to_unsplit": True, "peak_held": held[r]} for r in (0, 1)}
    wrong = {"predicted_equal_to_unsplit": False, "predicted_gpipe_peak_held": 2}
    predictions.assert_checked(STEM, "10.2", "## 4.", ranks, wrong)
