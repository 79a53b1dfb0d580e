"""Benchmark: DDP throughput at world size N vs one process, measured side by side.

Runs notebook 02's DDP script (scripts/ddp_train.py, its cells' committed copy) under torchrun
with the same global batch per step, alternating the setups in every repeat so that background
load hits them alike, and prints the median samples/s of each, the speed-up of N ranks over one
process, the limit (N x) and the fraction of the limit reached, and both runs' test accuracy.

The baseline is one process with one rank's share of the cores (``--threads cores // N``): one
"device", as one GPU is on a GPU machine. Two more setups say what the script's thread line is
worth: one process with every core, and N ranks that each take every core (PyTorch's default
when nothing sets the threads), which oversubscribes the cores N times.

Each setup also reports the CPU milliseconds its processes spent per sample (all threads). Unlike
samples/s, that barely moves when other programs share the machine, so N x (single process's CPU
per sample) / (a rank's CPU per sample) is the speed-up N idle cores would allow: on a busy
machine it says what the wall-clock ratio would be without the noise.

    .venv/bin/python benchmarks/ddp_scaling.py --repeats 3
    .venv/bin/python benchmarks/ddp_scaling.py --repeats 3 --only-baseline   # the two main rows
    .venv/bin/python benchmarks/ddp_scaling.py --repeats 1 --only-baseline --json runs/s.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import env, launch  # noqa: E402
from helpers.paths import REPO_ROOT  # noqa: E402

GOAL = 0.8  # of the limit: 1.6x for 2 ranks


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def measure(world: int, threads: int, args: argparse.Namespace, device: str) -> dict:
    """One run of the DDP script: all ranks' samples/s, CPU ms per sample, test accuracy."""
    with tempfile.TemporaryDirectory() as out:  # rank 0's weights: not kept
        result = launch.torchrun(
            REPO_ROOT / "scripts" / "ddp_train.py",  # notebook 02's script, committed
            [
                "--epochs",
                str(args.epochs),
                "--batch-size",
                str(args.global_batch // world),
                "--threads",
                str(threads),
                "--snapshot-steps",
                "--out",
                out,
            ],
            nproc=world,
            device=device,
            env={"OMP_NUM_THREADS": str(threads)},
            max_lines=0,
            timeout=1800,
        )
    ranks = [result.rank(r) for r in sorted(result.outputs)]
    return {
        "rate": sum(r["samples_per_s"] for r in ranks),
        "cpu_ms": statistics.mean(r["cpu_ms_per_sample"] for r in ranks),
        "accuracy": ranks[0]["accuracy"],
    }


def setups(world: int, only_baseline: bool) -> dict[str, tuple[int, int]]:
    """Name -> (processes, threads per process)."""
    share = max(1, cores() // world)
    chosen = {
        "1 process, one rank's share": (1, share),
        f"{world} ranks, a share each": (world, share),
    }
    if not only_baseline:
        chosen["1 process, every core"] = (1, cores())
        chosen[f"{world} ranks, every core each"] = (world, cores())
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--only-baseline", action="store_true", help="skip the two extra setups")
    parser.add_argument("--json", type=Path, help="also write the two main rows' rates here")
    args = parser.parse_args()
    plan = env.device_plan()
    world = plan["nproc"]
    if world < 2:
        print(f"{plan['device']}: one device, nothing to scale (needs 2+ GPUs, or a CPU machine)")
        return 2
    runs = {name: [] for name in setups(world, args.only_baseline)}
    load_before = os.getloadavg()[0]
    for i in range(args.repeats):
        for name, (nproc, threads) in setups(world, args.only_baseline).items():
            runs[name].append(measure(nproc, threads, args, plan["device"]))
            print(f"repeat {i + 1}: {name:32} {runs[name][-1]['rate']:7.0f} samples/s", flush=True)
    load = max(load_before, os.getloadavg()[0])
    rate = {name: statistics.median(r["rate"] for r in rs) for name, rs in runs.items()}
    base, ddp = list(rate)[:2]
    print(
        f"\n{plan['device']}, {cores()} cores, global batch {args.global_batch}, "
        f"median of {args.repeats}; load average {load:.1f} (busy above {cores()})"
    )
    cpu = {name: statistics.median(r["cpu_ms"] for r in rs) for name, rs in runs.items()}
    for name, value in rate.items():
        accuracy = statistics.median(r["accuracy"] for r in runs[name])
        print(
            f"  {name:32} {value:7.0f} samples/s  {value / rate[base]:5.2f}x  "
            f"{cpu[name]:5.2f} CPU ms/sample  accuracy {accuracy:.4f}"
        )
    speedup = rate[ddp] / rate[base]
    print(
        f"\n{world} ranks vs one process: {speedup:.2f}x; limit {world:.1f}x; "
        f"{speedup / world:.0%} of the limit (goal {GOAL:.0%})"
    )
    allowed = world * cpu[base] / cpu[ddp]
    print(
        f"CPU time per sample allows {allowed:.2f}x with every process on idle cores "
        f"({allowed / world:.0%} of the limit): DDP's own cost is the rest"
    )
    if load > cores():
        print("The machine was busy (load above the core count): the ratio is noisy and low.")
    if args.json:  # every repeat of the two main rows, keyed by world size (make gpu-check)
        record = {
            "device": plan["device"],
            "global_batch": args.global_batch,
            "epochs": args.epochs,
            "repeats": args.repeats,
            "load_average": load,
            "samples_per_s": {
                "1": [r["rate"] for r in runs[base]],
                str(world): [r["rate"] for r in runs[ddp]],
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
