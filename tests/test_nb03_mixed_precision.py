"""Notebook 03: fp32, bf16 and fp16 all train; bf16 keeps fp32's accuracy; the scaler skips
overflowing steps; DDP trains with --amp bf16; the ResNet-50 benchmark refuses without CUDA."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

STEM = "03_mixed_precision"
MODES = {"fp32", "bf16", "fp16"}
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "amp_resnet50.py"


def _floor(metrics: dict) -> float:
    """What "trained" means: 0.85 on real MNIST; well above chance on the synthetic stand-in."""
    return 0.85 if metrics["dataset"] == "mnist" else 0.3


def test_every_mode_trained(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert set(m["accuracy"]) == MODES
    for mode, accuracy in m["accuracy"].items():
        assert accuracy >= _floor(m), f"{mode} reached only {accuracy}"
    assert all(m["steps"][mode] > 5 for mode in MODES)  # past the timer's warm-up


def test_bf16_keeps_fp32_accuracy(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert abs(m["accuracy"]["bf16"] - m["accuracy"]["fp32"]) <= 0.02


def test_throughput_measured_for_each_mode(notebook_record):
    m = notebook_record(STEM)["metrics"]
    sps = m["samples_per_s"]
    assert set(sps) == MODES
    assert all(v > 0 for v in sps.values())
    assert m["speedup_bf16"] == pytest.approx(sps["bf16"] / sps["fp32"])
    assert m["speedup_fp16"] == pytest.approx(sps["fp16"] / sps["fp32"])
    assert m["device"] in ("cpu", "cuda", "mps")


def test_peak_memory_per_mode(notebook_record):
    m = notebook_record(STEM)["metrics"]
    peak = m["peak_memory_bytes"]
    assert set(peak) == MODES
    for value in peak.values():
        assert value is None or (isinstance(value, int) and not isinstance(value, bool))
    if m["device"] in ("cpu", "cuda"):  # measured there (profiler / max_memory_allocated)
        assert all(v > 0 for v in peak.values())
        assert peak["bf16"] < peak["fp32"]  # 16-bit activations
        assert m["memory_ratio_bf16"] == pytest.approx(peak["bf16"] / peak["fp32"])


def test_autocast_dtypes_per_op(notebook_record):
    dtypes = notebook_record(STEM)["metrics"]["autocast_dtypes"]
    assert set(dtypes["fp32"].values()) == {"float32"}
    for mode, low in (("bf16", "bfloat16"), ("fp16", "float16")):
        assert dtypes[mode]["conv2d"] == low
        assert dtypes[mode]["linear (matmul)"] == low
        assert dtypes[mode]["cross_entropy"] == "float32"
        assert dtypes[mode]["parameters"] == "float32"  # master weights stay fp32
        assert dtypes[mode]["gradients"] == "float32"


def test_the_seed_import_is_deprecated(notebook_record):
    warnings = notebook_record(STEM)["metrics"]["seed_api_warnings"]
    deprecations = [w for w in warnings if w.startswith("FutureWarning") and "deprecated" in w]
    assert any("torch.amp.autocast" in w for w in deprecations)
    assert any("torch.amp.GradScaler" in w for w in deprecations)


def test_gradscaler_skips_an_overflowing_step(notebook_record):
    m = notebook_record(STEM)["metrics"]
    assert m["gradscaler_steps_skipped"] >= 1
    assert m["gradscaler_first_scale_after_overflow"] == 2.0**29  # 2^30 halved
    assert m["max_param_diff_after_overflow"] == 0.0  # skipped: parameters untouched
    assert m["param_change_first_good_step"] > 0
    assert m["fp16_skipped_steps"] < m["steps"]["fp16"], "the scale backs off, then fp16 trains"


def test_why_fp16_needs_scaling(notebook_record):
    under = notebook_record(STEM)["metrics"]["grad_underflow_fraction"]
    assert under["bf16"] == 0.0
    assert under["fp16_scaled"] <= under["fp16"]


def test_ddp_trains_with_bf16_autocast(notebook_record):
    record = notebook_record(STEM)
    m = record["metrics"]
    bf16 = m["ddp"]["bf16"]
    assert bf16["amp"] == "bf16"
    assert bf16["world_size"] == record["hardware"]["nproc"]
    assert bf16["steps"] > 0 and bf16["samples_per_s"] > 0
    assert m["ddp_accuracy_bf16"] == bf16["accuracy"] >= _floor(m)


def test_resnet50_benchmark_ran_or_was_skipped_with_reason(notebook_record):
    record = notebook_record(STEM)
    skips = [s for s in record["skipped"] if s["what"].startswith("ResNet-50")]
    if record["metrics"]["device"] == "cuda":
        assert not skips
        assert record["metrics"]["resnet50"]["fp32"]["speedup"] == pytest.approx(1.0)
    else:
        assert record["metrics"]["resnet50"] is None
        assert skips and "CUDA" in skips[0]["why"]


# ------------------------------------------------------------- the benchmark script itself


def _bench_module():
    spec = importlib.util.spec_from_file_location("amp_resnet50", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusal is what happens without CUDA")
def test_benchmark_refuses_without_cuda(no_orphans):
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--steps", "1"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs a CUDA GPU" in proc.stderr
    assert "images/s" not in proc.stdout  # refused before measuring anything


def test_benchmark_logic_on_a_tiny_model():
    """The measurement, ratios and goal lines, checked on CPU with a tiny model."""
    bench = _bench_module()

    def tiny(num_classes: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, num_classes),
        )

    results = [
        bench.bench_mode(
            mode,
            device=torch.device("cpu"),
            batch_size=2,
            steps=2,
            warmup=1,
            image_size=8,
            num_classes=3,
            model_fn=tiny,
        )
        for mode in ("fp32", "bf16")
    ]
    bench.add_ratios(results)
    assert results[0]["speedup"] == 1.0
    assert all(r["images_per_s"] > 0 and r["peak_memory_bytes"] is None for r in results)
    table = bench.format_table(results)
    assert "1.00x" in table and "bf16" in table
    report, met = bench.goal_report(results)
    assert report.startswith("bf16:") and met is False  # no memory figure on CPU: not met


def test_the_exercises_run_a_job_and_pass(notebook_record):
    """Issue 44: both end section 5 and compare the solution's prediction with the job's ranks:
    03.1, bf16 from a loss scale of 1e9 skips no step; 03.2, fp16 from 1e9 skips steps, the
    same ones on every rank."""
    assert notebook_record(STEM)["metrics"]["exercises"] == {"03.1": True, "03.2": True}


def test_a_published_gpu_figure_stands_beside_the_measured_one(notebook_record):
    """Issue 44: a CPU can measure AMP slower than fp32; the lesson records NVIDIA's published
    ResNet-50 figures beside its own, and says which way this run went."""
    m = notebook_record(STEM)["metrics"]
    published = m["published_amp_resnet50"]
    assert published["images_per_s"]["A100 80GB"] == {"TF32": 938, "mixed precision": 2470}
    assert published["images_per_s"]["V100 16GB"] == {"FP32": 367, "mixed precision": 1200}
    assert published["speedup"] == {"A100 80GB": 2.63, "V100 16GB": 3.26}
    assert "ResNet50 v1.5 For PyTorch" in published["source"]
    assert published["url"].startswith("https://github.com/NVIDIA/DeepLearningExamples/")
    said = dict(part.split(" ", 1) for part in m["amp_verdict"].split(": ", 1)[1].split(", "))
    for mode in ("bf16", "fp16"):
        speedup = m[f"speedup_{mode}"]
        if speedup is not None:  # None: bf16 skipped on a GPU older than Ampere
            way = "faster" if speedup > 1 else "slower"
            assert said[mode] == f"{speedup:.2f}x fp32's samples/s ({way})"
