"""``make gpu-check``: the GPU path proved in one short run, and the figures it leaves behind.

On a machine with NVIDIA GPUs it runs the doctor, then what has never run on a GPU (the
lessons' own scripts at the machine's world size: ``labtools.gpu_first_runs``), every notebook
in quick mode (those whose GPU-only paths it reports first), then the AMP
ResNet-50 and DDP scaling benchmarks briefly, all into one ``runs/<timestamp>/``: the executed
notebooks, ``summary.json`` (every outcome, the doctor, the hardware), the benchmarks' JSON and
logs, and ``figures.json`` + ``RESULTS.md``, the numbers ``benchmarks/RESULTS.md`` and the
catalog's ``measured_gpu`` are filled from. Every figure is read from the run's own files; what
did not run is written as "not measured", never guessed. A budget (8 minutes: one short remote
session) caps the notebooks' time limits and keeps time for the benchmarks.

Without a GPU it says so and exits 0 having run nothing heavy: CPU machines have ``make test``.

    python -m labtools.gpucheck                                # the run (what make gpu-check does)
    python -m labtools.gpucheck --figures runs/latest --write  # RESULTS.md and catalog.json from it
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from helpers import env
from helpers.paths import REPO_ROOT
from helpers.procs import kill_tree
from labtools import catalog, gpu_first_runs, run_folder, runner

RESULTS = REPO_ROOT / "benchmarks" / "RESULTS.md"
BUDGET_S = 480.0  # one short remote session on one modern GPU (issue 16)
RESERVE_S = 150.0  # kept from the notebooks for the two benchmarks
FIRST_RUNS_S = 180.0  # at most, for what never ran on a GPU before (labtools.gpu_first_runs)
MIN_NOTEBOOK_S = 30.0  # below this a notebook is not started: it could only time out
BENCHMARKS = {  # brief settings: enough steps for a median, not a careful measurement
    "amp_resnet50": ["--warmup", "5", "--steps", "10"],
    "ddp_scaling": ["--repeats", "1", "--only-baseline"],
}


def no_gpu_reason(gpus: env.GPUInfo) -> str | None:
    """Why this machine cannot do a GPU check, or None when CUDA devices are visible."""
    if gpus.count:
        return None
    why = "; ".join(gpus.notes) or gpus.error or "none found"
    return f"no NVIDIA GPU visible ({why})"


def run_doctor(gpus: env.GPUInfo, run_dir: Path) -> list[dict[str, str]]:
    """The doctor's table, printed and kept as doctor.json."""
    checks = env.run_checks(gpus)
    print(env.format_table(checks), flush=True)
    rows = [asdict(c) for c in checks]
    (run_dir / "doctor.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def notebook_order() -> list[str]:
    """The lessons in the order gpu-check runs them: 00 (is the GPU seen at all), then those
    whose GPU-only figures it reports, then the rest, each group in lesson order. Fifteen quick
    lessons do not all fit one short session's budget; what it leaves out is the least news."""
    stems = runner.notebook_stems()
    first = {stems[0], DATALOADER} | {stem for stem, _ in GPU_PATHS.values()}
    return [s for s in stems if s in first] + [s for s in stems if s not in first]


def run_notebooks(run_dir: Path, deadline: float) -> list[runner.Outcome]:
    """Every notebook in quick mode, each within its catalog limit and what the budget leaves."""
    outcomes = []
    for stem in notebook_order():
        left = deadline - time.monotonic() - RESERVE_S
        if left < MIN_NOTEBOOK_S:
            outcomes.append(
                runner.Outcome(
                    stem, "not run", 0.0, "", str(run_dir / stem), "the gpu-check budget was spent"
                )
            )
            continue
        print(f"-> {stem} (quick) ...", flush=True)
        timeout = min(catalog.catalog_entry(stem)["timeout_quick_s"], left)
        outcome = runner.execute(stem, run_dir / stem, quick=True, timeout=timeout)
        print(f"   {outcome.status} in {outcome.seconds:.1f} s", flush=True)
        outcomes.append(outcome)
    return outcomes


def run_benchmark(name: str, run_dir: Path, timeout: float) -> dict[str, Any]:
    """One benchmark script, its output in <name>.log and its figures in <name>.json."""
    out = run_dir / f"{name}.json"
    argv = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / f"{name}.py"),
        *BENCHMARKS[name],
        "--json",
        str(out),
    ]
    print(f"-> benchmarks/{name}.py {' '.join(BENCHMARKS[name])} ...", flush=True)
    start = time.perf_counter()
    with open(run_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=max(timeout, 1.0))
            status = "ok" if proc.returncode == 0 and out.exists() else "failed"
        except subprocess.TimeoutExpired:
            kill_tree(proc)  # torchrun and its workers too
            status = "timed out"
    seconds = round(time.perf_counter() - start, 2)
    print(f"   {status} in {seconds:.1f} s (log: {name}.log)", flush=True)
    return {
        "status": status,
        "seconds": seconds,
        "returncode": proc.returncode,
        "json": str(out) if out.exists() else None,
    }


def check(run_dir: Path, budget: float) -> int:
    """The whole run; 0 when every notebook and benchmark passed."""
    gpus = env.gpu_info()
    start, deadline = time.perf_counter(), time.monotonic() + budget
    summary: dict[str, Any] = {
        "started": run_dir.name,
        "quick": True,
        "params": [],
        "gpu_check": {"budget_s": budget},
        "hardware": env.hardware_summary(gpus),
    }
    summary["doctor"] = run_doctor(gpus, run_dir)
    failed = [c["name"] for c in summary["doctor"] if c["status"] == env.FAIL]
    first_deadline = min(time.monotonic() + FIRST_RUNS_S, deadline - RESERVE_S)
    summary["first_runs"] = (
        {} if failed else gpu_first_runs.run_all(run_dir, gpus.count, first_deadline)
    )
    outcomes = [] if failed else run_notebooks(run_dir, deadline)
    summary["notebooks"] = [asdict(o) for o in outcomes]
    summary["benchmarks"] = (
        {}
        if failed
        else {
            name: run_benchmark(name, run_dir, deadline - time.monotonic()) for name in BENCHMARKS
        }
    )
    summary["gpu_check"]["seconds"] = round(time.perf_counter() - start, 1)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    figs = write_figures(run_dir)
    print("\n" + runner.summary_table(outcomes) + "\n\n" + results_markdown(figs))
    if failed:
        print(f"\nThe doctor failed {failed}: fix those first (see the hints above).")
    ok = all(o.status == "ok" for o in outcomes) and all(
        b["status"] == "ok" for b in summary["benchmarks"].values()
    )
    ok = ok and not any(v.startswith("did not hold") for v in summary["first_runs"].values())
    return 0 if ok and not failed else 1


# ------------------------------------------------------------- figures from a run folder


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _amp(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    data = _load(run_dir / "amp_resnet50.json")
    if not data:
        return None
    keys = ("images_per_s", "speedup", "peak_memory_bytes", "memory_ratio")
    return {r["mode"]: {k: r.get(k) for k in keys} for r in data["results"]}


def _scaling(run_dir: Path) -> dict[str, dict[str, float]] | None:
    data = _load(run_dir / "ddp_scaling.json")
    if not data or "1" not in data["samples_per_s"]:
        return None
    medians = {w: statistics.median(v) for w, v in data["samples_per_s"].items()}
    return {
        w: {
            "samples_per_s": r,
            "speedup": r / medians["1"],
            "efficiency": r / medians["1"] / int(w),
        }
        for w, r in medians.items()
    }


def _record(run_dir: Path, stem: str) -> dict[str, Any] | None:
    """The metrics.json that lesson ``stem`` left in this run, if it did."""
    return _load(run_dir / stem / "metrics.json")


DATALOADER = "04_dataloader_tuning"  # the lesson whose tuned loader the results report


def _dataloader(run_dir: Path) -> dict[str, Any] | None:
    record = _record(run_dir, DATALOADER)
    if not record:
        return None
    m = record["metrics"]
    keys = ("samples_per_s_naive", "samples_per_s_tuned", "speedup_best_vs_naive", "best_config")
    return {k: m.get(k) for k in keys}


def _why_not(record: dict[str, Any], what: str) -> str:
    why = next((s["why"] for s in record["skipped"] if s["what"] == what), "no reason recorded")
    return f"not run: {why}"


def _fsdp_on_nccl(record: dict[str, Any]) -> str:
    diff = record["metrics"].get("max_param_diff_fsdp_vs_single_nccl")
    if diff is None:
        return _why_not(record, "FSDP2 vs one process on NCCL")
    return f"max weight difference {diff:.1e} (the tests' bound: 1e-5)"


def _nccl_hang(record: dict[str, Any]) -> str:
    m = record["metrics"]
    if m.get("hang_backend") != "nccl":
        return _why_not(record, "hung_collective_nccl")
    return (
        f"the hung all_reduce raised after {m['hang_collective_raised_after_seconds']:.1f} s "
        f"(timeout {m['hang_timeout_seconds']} s, TORCH_NCCL_BLOCKING_WAIT=1)"
    )


def _context_parallel(record: dict[str, Any]) -> str:
    diff = record["metrics"].get("max_diff_torch_cp_vs_full")
    if diff is None:
        return _why_not(record, "torch's context_parallel")
    return f"max difference from full causal attention {diff:.1e} (the tests' bound: 1e-5)"


def _gpu_memory(record: dict[str, Any]) -> str:
    m = record["metrics"]
    if "cuda_context_mib" not in m:
        return _why_not(record, "torch.cuda.memory_allocated and the CUDA context")
    return (
        f"activations {m['device_activation_error']:.1%} from the formula (target 10 %); "
        f"CUDA context {m['cuda_context_mib']:.0f} MiB"
    )


def _offload(record: dict[str, Any]) -> str:
    zero = record["metrics"].get("zero_bytes_per_rank", {})
    if "offload" not in zero:
        return _why_not(record, "CPUOffloadPolicy per-rank memory")
    return f"ZeRO-3 state in host memory; {zero['offload_on_gpu']:,} bytes of it left on the GPU"


def _mfu(record: dict[str, Any]) -> str:
    """MFU against the exact part's datasheet peak, the measured (achievable) peak beside it."""
    m = record["metrics"]
    if "mfu" not in m:
        return _why_not(record, "MFU against the datasheet peak")
    return (
        f"MFU {m['mfu']:.1%} of the {m['datasheet_part']}'s dense bf16 "
        f"{m['datasheet_bf16_tflops']} TFLOP/s (HFU {m['hfu_checkpointed']:.1%} checkpointed); "
        f"measured matmul peak {m['matmul_peak_tflops']:.1f} TFLOP/s, "
        f"{m['measured_over_datasheet']:.0%} of the datasheet's"
    )


def _compiled_step(record: dict[str, Any]) -> str:
    compiled = record["metrics"].get("compile")
    if not compiled:
        return _why_not(record, "torch.compile with DDP")
    return "; ".join(
        f"{kind}: {c['graphs']} graph(s), first step {c['first_step_seconds']:.1f} s, "
        f"{c['eager_step_seconds'] / c['compiled_step_seconds']:.2f}x eager"
        for kind, c in compiled.items()
    )


GPU_PATHS = {  # what the CPU suite cannot run, read from the notebook that runs it on GPUs
    "FSDP2 vs one process on NCCL": ("08_fully_sharded_data_parallel", _fsdp_on_nccl),
    "a hung NCCL collective with blocking wait": ("13_troubleshooting", _nccl_hang),
    "torch.compile of a distributed step": ("06_ddp_in_practice", _compiled_step),
    "torch's context_parallel (CUDA attention kernels)": (
        "11_context_and_expert_parallel",
        _context_parallel,
    ),
    "activations by the CUDA allocator": ("12_arithmetic_of_parallelism", _gpu_memory),
    "ZeRO-3 with CPUOffloadPolicy": ("12_arithmetic_of_parallelism", _offload),
    "MFU in bf16 on the GPU": ("12_arithmetic_of_parallelism", _mfu),
}


def _gpu_paths(run_dir: Path) -> dict[str, str]:
    """Each GPU-only path: what it measured, or why it did not run (as the notebook recorded)."""
    out = {}
    for what, (stem, say) in GPU_PATHS.items():
        record = _record(run_dir, stem)
        out[what] = say(record) if record else f"not run: {stem} left no record"
    return out


def figures(run_dir: Path) -> dict[str, Any]:
    """What RESULTS.md and the catalog need, read from the run's files (None: not measured)."""
    summary = _load(run_dir / "summary.json") or {}
    hw = summary.get("hardware") or {}
    names = hw.get("gpu_names") or ["no GPU"]
    return {
        "run": str(run_dir),
        "on": f"{len(hw.get('gpu_names') or [])}x {names[0]}, driver {hw.get('driver')}, "
        f"torch {hw.get('torch')} (make gpu-check, {run_dir.name})",
        "notebook_quick_s": {
            nb["notebook"]: nb["seconds"] if nb["status"] == "ok" else None
            for nb in summary.get("notebooks", [])
        },
        "amp_resnet50": _amp(run_dir),
        "ddp_scaling": _scaling(run_dir),
        "dataloader": _dataloader(run_dir),
        "gpu_paths": _gpu_paths(run_dir),
        "first_runs": summary.get("first_runs") or {},
    }


def write_figures(run_dir: Path) -> dict[str, Any]:
    figs = figures(run_dir)
    (run_dir / "figures.json").write_text(json.dumps(figs, indent=2) + "\n")
    (run_dir / "RESULTS.md").write_text(results_markdown(figs))
    return figs


def _num(value: Any, fmt: str = ".2f", unit: str = "") -> str:
    return "not measured" if value is None else f"{value:{fmt}}{unit}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["", f"## {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _amp_table(amp: dict[str, dict[str, Any]] | None) -> list[str]:
    rows = [
        [
            mode,
            _num(r["images_per_s"], ".1f"),
            _num(r["speedup"], ".2f", "x"),
            _num(r["peak_memory_bytes"] and r["peak_memory_bytes"] / 2**30, ".2f"),
            _num(r["memory_ratio"], ".2f", "x"),
        ]
        for mode, r in (amp or {}).items()
    ]
    title = "ResNet-50 AMP (`benchmarks/amp_resnet50.py`, brief: 5 warm-up + 10 timed steps)"
    header = ["mode", "images/s", "vs fp32", "peak GiB", "memory vs fp32"]
    return _table(title, header, rows or [["not measured", "", "", "", ""]])


def _scaling_table(scaling: dict[str, dict[str, float]] | None) -> list[str]:
    rows = [
        [
            w,
            _num(r["samples_per_s"], ".0f"),
            _num(r["speedup"], ".2f", "x"),
            _num(r["efficiency"], ".0%"),
        ]
        for w, r in (scaling or {}).items()
    ]
    header = ["world size", "samples/s", "speed-up", "efficiency"]
    title = "DDP scaling (`benchmarks/ddp_scaling.py --repeats 1`)"
    return _table(title, header, rows or [["not measured", "", "", ""]])


def _loader_table(loader: dict[str, Any] | None) -> list[str]:
    loader = loader or {}
    row = [
        _num(loader.get("samples_per_s_naive"), ".0f"),
        _num(loader.get("samples_per_s_tuned"), ".0f"),
        _num(loader.get("speedup_best_vs_naive"), ".2f", "x"),
        str(loader.get("best_config") or "not measured"),
    ]
    header = ["naive samples/s", "tuned samples/s", "speed-up", "tuned setting"]
    return _table("DataLoader, tuned vs naive (notebook 04, quick mode)", header, [row])


def results_markdown(figs: dict[str, Any]) -> str:
    """benchmarks/RESULTS.md: six small tables, every figure from the run named at the top."""
    lines = [
        "# Results on a GPU",
        "",
        f"Measured on {figs['on']}. Written by `python -m labtools.gpucheck --figures RUN "
        '--write` from that run\'s files; "not measured" where a part did not run.',
    ]
    lines += _amp_table(figs["amp_resnet50"]) + _scaling_table(figs["ddp_scaling"])
    lines += _loader_table(figs["dataloader"])
    paths = [[what, said] for what, said in (figs.get("gpu_paths") or {}).items()]
    first = [[what, said] for what, said in (figs.get("first_runs") or {}).items()]
    title = (
        "First runs: the lessons' scripts at this machine's world size (labtools.gpu_first_runs)"
    )
    lines += _table(title, ["what", "verdict"], first or [["not run", "no record in this run"]])
    lines += _table("GPU paths the CPU suite cannot run", ["path", "result"], paths)
    times = figs["notebook_quick_s"]
    notebooks = [[stem, _num(times[stem], ".1f")] for stem in sorted(times)]  # lesson order
    lines += _table("Notebooks, quick mode", ["notebook", "seconds"], notebooks)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labtools.gpucheck", description=__doc__)
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the run")
    parser.add_argument("--runs", default=str(REPO_ROOT / "runs"), help="where runs are kept")
    parser.add_argument("--figures", type=Path, help="only read the figures of this run")
    parser.add_argument(
        "--write", action="store_true", help="with --figures: write RESULTS.md and catalog.json"
    )
    args = parser.parse_args(argv)
    if args.figures:
        if not (args.figures / "summary.json").exists():
            parser.error(f"{args.figures} has no summary.json: name a make gpu-check run folder")
        figs = write_figures(args.figures)
        print(results_markdown(figs))
        if args.write:
            RESULTS.write_text(results_markdown(figs))
            catalog.record_times("measured_gpu", figs["notebook_quick_s"], figs["on"])
            print(f"Wrote {RESULTS} and the measured_gpu entries of notebooks/catalog.json")
        return 0
    reason = no_gpu_reason(env.gpu_info())
    if reason:
        print(
            f"gpu-check: {reason}. It needs an NVIDIA GPU; nothing was run. "
            f"On this machine, `make test` runs every lesson on CPU."
        )
        return 0
    run_dir = run_folder.new_run_dir(Path(args.runs))
    print(f"gpu-check: run folder {run_dir}, budget {args.budget:.0f} s", flush=True)
    return check(run_dir, args.budget)


if __name__ == "__main__":
    sys.exit(main())
