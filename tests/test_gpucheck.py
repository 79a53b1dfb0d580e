"""`make gpu-check`: refuses politely without a GPU, keeps to its budget, and turns a run folder
into RESULTS.md and the catalog's GPU times without inventing a number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from labtools import catalog, gpucheck, runner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from amp_resnet50 import add_ratios  # noqa: E402  (the benchmark's own ratio arithmetic)


def test_without_a_gpu_it_says_so_exits_0_and_runs_nothing(tmp_path, no_orphans):
    runs = tmp_path / "runs"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "-1"}  # no GPU, even on a GPU machine
    argv = [sys.executable, "-m", "labtools.gpucheck", "--runs", str(runs)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "no NVIDIA GPU visible" in out.stdout and "nothing was run" in out.stdout
    assert not runs.exists()


def test_make_target_runs_the_module():
    argv = ["make", "--no-print-directory", "-n", "gpu-check"]  # also when run under make
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip().splitlines()[-1].endswith("-m labtools.gpucheck")


def test_a_spent_budget_starts_no_notebook(tmp_path):
    outcomes = gpucheck.run_notebooks(tmp_path, deadline=time.monotonic())
    assert [o.notebook for o in outcomes] == gpucheck.notebook_order()
    assert {o.status for o in outcomes} == {"not run"}
    assert not list(tmp_path.iterdir())  # nothing executed, nothing written


def test_the_lessons_with_gpu_only_figures_run_first():
    """A budget spent before the last lessons must not cost the figures only a GPU gives."""
    order, stems = gpucheck.notebook_order(), runner.notebook_stems()
    assert sorted(order) == sorted(stems) and order[0] == stems[0]
    wanted = {stem for stem, _ in gpucheck.GPU_PATHS.values()} | {gpucheck.DATALOADER}
    first = order[1 : 1 + len(wanted)]
    assert set(first) == wanted and first == sorted(first)  # in lesson order
    assert order[1 + len(wanted) :] == [s for s in stems if s not in wanted | {stems[0]}]


def _fake_run(run_dir: Path) -> None:
    """A run folder as make gpu-check leaves it, with figures chosen for this test."""
    summary = {
        "started": run_dir.name,
        "quick": True,
        "hardware": {"gpu_names": ["NVIDIA H200"], "driver": "580.1", "torch": "2.14.1"},
        "notebooks": [
            {"notebook": "00_environment", "status": "ok", "seconds": 12.34},
            {"notebook": "02_distributed_data_parallel", "status": "failed", "seconds": 99.0},
        ],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    amp = add_ratios(
        [
            {"mode": "fp32", "images_per_s": 400.0, "peak_memory_bytes": 20 << 30},
            {"mode": "bf16", "images_per_s": 1100.0, "peak_memory_bytes": 11 << 30},
        ]
    )
    (run_dir / "amp_resnet50.json").write_text(json.dumps({"results": amp}))
    scaling = {"device": "cuda", "samples_per_s": {"1": [1000.0], "2": [1800.0]}}
    (run_dir / "ddp_scaling.json").write_text(json.dumps(scaling))


def test_figures_come_from_the_run_and_missing_ones_say_not_measured(tmp_path):
    _fake_run(tmp_path)
    figs = gpucheck.figures(tmp_path)
    assert figs["notebook_quick_s"] == {
        "00_environment": 12.34,
        "02_distributed_data_parallel": None,
    }
    assert figs["amp_resnet50"]["bf16"]["speedup"] == 1100.0 / 400.0
    assert figs["amp_resnet50"]["bf16"]["memory_ratio"] == 11 / 20
    assert figs["ddp_scaling"]["2"]["efficiency"] == 1800.0 / 1000.0 / 2
    assert figs["dataloader"] is None  # notebook 04 left no record in this run
    text = gpucheck.results_markdown(figs)
    assert "1x NVIDIA H200, driver 580.1" in text
    assert "| bf16 | 1100.0 | 2.75x | 11.00 | 0.55x |" in text
    assert "| 2 | 1800 | 1.80x | 90% |" in text
    assert "| 00_environment | 12.3 |" in text
    assert "| 02_distributed_data_parallel | not measured |" in text
    assert "| not measured | not measured | not measured | not measured |" in text


def test_figures_write_results_and_the_catalogs_gpu_times(tmp_path):
    _fake_run(tmp_path)
    path = tmp_path / "catalog.json"
    path.write_text((ROOT / "notebooks" / "catalog.json").read_text())
    figs = gpucheck.write_figures(tmp_path)
    catalog.record_times("measured_gpu", figs["notebook_quick_s"], figs["on"], path)
    entries = {e["stem"]: e for e in json.loads(path.read_text())["notebooks"]}
    assert entries["00_environment"]["measured_gpu"]["quick_s"] == 12.34
    assert "NVIDIA H200" in entries["00_environment"]["measured_gpu"]["on"]
    assert entries["02_distributed_data_parallel"]["measured_gpu"]["quick_s"] is None
    assert "measured_gpu" not in entries["01_data_parallel"]  # not in this run: untouched
    assert entries["00_environment"]["measured"]["quick_s"]  # the CPU figures stay
    assert (tmp_path / "RESULTS.md").read_text().startswith("# Results on a GPU")
    assert json.loads((tmp_path / "figures.json").read_text())["run"] == str(tmp_path)


def _fake_record(run_dir: Path, stem: str, metrics: dict, skipped: list | None = None) -> None:
    (run_dir / stem).mkdir(parents=True)
    record = {"notebook": stem, "metrics": metrics, "skipped": skipped or []}
    (run_dir / stem / "metrics.json").write_text(json.dumps(record))


def test_gpu_paths_say_what_ran_and_why_the_rest_did_not(tmp_path):
    """One H200: 08's proof ran as one NCCL rank, 13's NCCL hang needs 2 GPUs, 06 compiled."""
    _fake_run(tmp_path)
    _fake_record(
        tmp_path, "08_fully_sharded_data_parallel", {"max_param_diff_fsdp_vs_single_nccl": 2.5e-7}
    )
    one_gpu = "needs 2+ NVIDIA GPUs, one per NCCL rank (found 1)"
    _fake_record(
        tmp_path,
        "13_troubleshooting",
        {"hang_backend": "gloo"},
        [{"what": "hung_collective_nccl", "why": one_gpu}],
    )
    compiled = {"graphs": 3, "first_step_seconds": 12.0}
    compiled |= {"eager_step_seconds": 0.02, "compiled_step_seconds": 0.01}
    _fake_record(tmp_path, "06_ddp_in_practice", {"compile": {"ddp": compiled}})
    _fake_record(tmp_path, "11_context_and_expert_parallel", {"max_diff_torch_cp_vs_full": 3.1e-7})
    twelve = {"device_activation_error": 0.031, "cuda_context_mib": 517.0, "mfu": 0.42}
    twelve |= {"matmul_peak_tflops": 741.7, "datasheet_bf16_tflops": 989, "hfu_checkpointed": 0.5}
    twelve |= {"datasheet_part": "H200", "measured_over_datasheet": 0.75}
    twelve["zero_bytes_per_rank"] = {"ddp": {}, "offload": {}, "offload_on_gpu": 0}
    _fake_record(tmp_path, "12_arithmetic_of_parallelism", twelve)
    paths = gpucheck.figures(tmp_path)["gpu_paths"]
    assert paths["activations by the CUDA allocator"] == (
        "activations 3.1% from the formula (target 10 %); CUDA context 517 MiB"
    )
    assert paths["ZeRO-3 with CPUOffloadPolicy"].endswith("0 bytes of it left on the GPU")
    assert paths["MFU in bf16 on the GPU"] == (
        "MFU 42.0% of the H200's dense bf16 989 TFLOP/s (HFU 50.0% checkpointed); "
        "measured matmul peak 741.7 TFLOP/s, 75% of the datasheet's"
    )
    assert paths["FSDP2 vs one process on NCCL"].startswith("max weight difference 2.5e-07")
    assert paths["a hung NCCL collective with blocking wait"] == f"not run: {one_gpu}"
    assert (
        "ddp: 3 graph(s), first step 12.0 s, 2.00x eager"
        in paths["torch.compile of a distributed step"]
    )
    assert paths["torch's context_parallel (CUDA attention kernels)"].startswith(
        "max difference from full causal attention 3.1e-07"
    )
    text = gpucheck.results_markdown(gpucheck.figures(tmp_path))
    assert f"| a hung NCCL collective with blocking wait | not run: {one_gpu} |" in text
    cpu_only = {"matmul_peak_tflops": 0.2, "zero_bytes_per_rank": {"ddp": {}}}
    skipped = [
        {"what": "MFU against the datasheet peak", "why": "this CPU has no datasheet peak"},
        {"what": "torch.cuda.memory_allocated and the CUDA context", "why": "no NVIDIA GPU"},
        {"what": "CPUOffloadPolicy per-rank memory", "why": "the workers have no GPU"},
    ]
    _fake_record(tmp_path / "cpu", "12_arithmetic_of_parallelism", cpu_only, skipped)
    cpu_paths = gpucheck._gpu_paths(tmp_path / "cpu")
    assert cpu_paths["activations by the CUDA allocator"] == "not run: no NVIDIA GPU"
    assert cpu_paths["ZeRO-3 with CPUOffloadPolicy"] == "not run: the workers have no GPU"
    assert cpu_paths["MFU in bf16 on the GPU"] == "not run: this CPU has no datasheet peak"
    empty = gpucheck.figures(tmp_path / "nothing")["gpu_paths"]  # a run with no records at all
    assert set(empty.values()) == {
        f"not run: {stem} left no record" for stem, _ in gpucheck.GPU_PATHS.values()
    }


def test_the_lessons_gpucheck_reads_exist():
    """A lesson renamed or renumbered must take its GPU paths along, not drop them silently."""
    named = {stem for stem, _ in gpucheck.GPU_PATHS.values()} | {gpucheck.DATALOADER}
    assert named <= set(runner.notebook_stems())
