"""Benchmark: DDP throughput at world size N vs one process, measured side by side.

Runs notebook 02's DDP script (rebuilt from its cells) under torchrun, alternating world sizes
so that background load hits both alike, and prints the median samples/s of each with the
ratio. One process gets every core (OMP_NUM_THREADS = cores) and the global batch, so the
comparison is the fair one: same work per step, same hardware.

    .venv/bin/python benchmarks/ddp_scaling.py --repeats 3
    .venv/bin/python benchmarks/ddp_scaling.py --repeats 1 --json runs/ddp_scaling.json  # brief
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import env, launch, scripts  # noqa: E402


def measure(world: int, batch: int, epochs: int, device: str) -> float:
    """Samples/s of all ranks together for one run of the DDP script."""
    threads = {} if device == "cuda" else {"OMP_NUM_THREADS": str(os.cpu_count() // world)}
    result = launch.torchrun(
        scripts.ensure_script("02_distributed_data_parallel", "work/ddp_train.py",
                              cwd=scripts.NOTEBOOKS),
        ["--epochs", str(epochs), "--batch-size", str(batch // world), "--snapshot-steps"],
        nproc=world, device=device, env=threads, max_lines=0, timeout=1800,
    )  # fmt: skip
    return sum(result.rank(r)["samples_per_s"] for r in result.outputs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()
    plan = env.device_plan()
    sizes = [1, plan["nproc"]] if plan["device"] != "cuda" else sorted({1, 2, plan["nproc"]})
    sizes = [w for w in sizes if w <= plan["nproc"]]
    runs: dict[int, list[float]] = {w: [] for w in sizes}
    for i in range(args.repeats):
        for world in sizes:
            runs[world].append(measure(world, args.global_batch, args.epochs, plan["device"]))
            print(f"repeat {i + 1}: world size {world}: {runs[world][-1]:.0f} samples/s")
    base = statistics.median(runs[1])
    print(f"\n{plan['device']}, global batch {args.global_batch}, {args.repeats} repeats "
          f"(median)\nworld  samples/s  speed-up  efficiency")  # fmt: skip
    for world in sizes:
        rate = statistics.median(runs[world])
        print(f"{world:5d}  {rate:9.0f}  {rate / base:7.2f}x  {rate / base / world:9.0%}")
    if args.json:  # every repeat, so a reader can take the median (make gpu-check does)
        record = {"device": plan["device"], "global_batch": args.global_batch,
                  "epochs": args.epochs, "repeats": args.repeats,
                  "samples_per_s": {str(w): runs[w] for w in sizes}}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
