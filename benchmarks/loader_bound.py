"""Benchmark: how close the tuned DataLoader gets to the physical bound of the loader.

Notebook 06's setting (MNIST decoded at 112x112 and augmented, ``helpers.loaders.CostlyMNIST``).
The bound is one core's rate (``num_workers=0``) times the usable cores. ``tune_loader`` picks a
setting once, within its budget; then ``num_workers=0`` and the tuned loader are measured in
alternation, ``--repeats`` times, so background load hits both alike, and each round gives
``fraction = tuned / (cores x num_workers=0)``. The goal is a median fraction of at least 0.9.

    .venv/bin/python benchmarks/loader_bound.py --repeats 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.data import load_mnist, make_loader  # noqa: E402
from helpers.loaders import (  # noqa: E402
    CostlyMNIST,
    config_label,
    seed_worker,
    timed_loader_throughput,
    tune_loader,
    usable_cores,
)

GOAL = 0.9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per measurement")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--side", type=int, default=112, help="per-sample cost (CostlyMNIST)")
    parser.add_argument("--budget", type=float, default=30.0, help="tune_loader's budget, s")
    args = parser.parse_args()

    mp.set_forkserver_preload(["torch", "torchvision", "helpers.loaders"])
    mnist, kind = load_mnist(train=True)
    dataset = CostlyMNIST.from_dataset(mnist, side=args.side)
    cores = usable_cores()
    load_before = os.getloadavg()[0]
    print(
        f"{len(dataset)} {kind} digits at {args.side}px, {cores} usable cores, "
        f"load average {load_before:.1f}"
    )

    tuned = tune_loader(dataset, args.batch_size, budget_s=args.budget, batches=args.batches)
    for trial in tuned.trials:
        shown = f"{trial.samples_per_s:7.0f} samples/s" if trial.error is None else trial.error
        print(f"  tuner {config_label(trial.config):>7}: {shown}")
    print("  medians: " + ", ".join(f"{k} {v:.0f}" for k, v in tuned.by_config.items() if v))
    print(f"tuner chose {tuned.best} in {tuned.seconds:.1f} s")

    naive = make_loader(dataset, args.batch_size, num_workers=0)
    best = make_loader(
        dataset,
        args.batch_size,
        multiprocessing_context="forkserver",
        worker_init_fn=seed_worker,
        **tuned.best,
    )
    fractions, speedups = [], []
    for i in range(args.repeats):
        n = timed_loader_throughput(naive, args.batches).samples_per_s
        t = timed_loader_throughput(best, args.batches).samples_per_s
        fractions.append(t / (cores * n))
        speedups.append(t / n)
        print(
            f"repeat {i + 1}: num_workers=0 {n:6.0f}, tuned {t:6.0f} samples/s -> "
            f"{speedups[-1]:.2f}x, {fractions[-1]:.0%} of the bound"
        )
    del best  # persistent workers end here

    fraction = statistics.median(fractions)
    print(
        f"\nmedian of {args.repeats}: speed-up {statistics.median(speedups):.2f}x, "
        f"fraction of bound {fraction:.2f} (min {min(fractions):.2f}, max {max(fractions):.2f}); "
        f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(f"goal >= {GOAL}: {'met' if fraction >= GOAL else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
