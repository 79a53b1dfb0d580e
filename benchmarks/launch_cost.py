"""Benchmark: what one torchrun launch costs before and after the training itself.

Every lesson that launches a job pays a fixed price: torchrun's agent imports torch and holds a
rendezvous, each worker imports torch (and whatever the script imports), builds its process
group and model, and at the end everything tears down. On 2 CPU cores that price, paid by
dozens of launches, is most of the quick suite's time. This measures it side by side in one run:

- the import a worker pays: ``import torch`` alone, the kit's training-script imports, and
  ``import torch, torchvision`` (what every worker paid while helpers.data imported torchvision);
- what a process holding torch spends exiting (the same import with ``gc.freeze()`` at the end);
- ``import papermill``, which every notebook client pays, with rfc3987-syntax and without;
- a whole launch of notebook 02's script (``scripts/ddp_train.py``) that trains one step on 2 ranks:
  the fixed cost of a launch, with the one step and the test pass it still does.

    .venv/bin/python benchmarks/launch_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from helpers import launch  # noqa: E402

IMPORTS = {
    "import torch": "import torch",
    "the training script's imports": "import torch, helpers.data, helpers.models, helpers.launch, "
    "helpers.train, helpers.progress",
    "import torch, torchvision": "import torch, torchvision",
    # what exit costs a process holding torch: the final garbage collections walk every object
    # torch created, unless gc.freeze() moved them out of the collector's sight (not applied
    # in the kit: it would change interpreter shutdown behind the learner's back)
    "import torch, gc.freeze() at exit": "import torch, gc; gc.freeze()",
}
# Not torch: what every notebook client (papermill, nbconvert, nbval) pays before the kernel
# starts, with and without rfc3987-syntax (make setup removes it; blocked here if installed).
CLIENT_IMPORTS = {
    "import papermill": "import papermill",
    "import papermill, rfc3987_syntax blocked": "import sys; sys.modules['rfc3987_syntax'] = None; "
    "import papermill",
}


def seconds_to_import(code: str) -> float:
    """Wall seconds of a fresh interpreter that only imports (start-up included)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return time.perf_counter() - started


def seconds_per_launch(out: Path) -> float:
    """Wall seconds of one 2-rank launch of notebook 02's script that trains a single step."""
    started = time.perf_counter()
    launch.torchrun(
        ROOT / "scripts" / "ddp_train.py",
        ["--max-steps", "1", "--snapshot-steps", "--out", str(out)],
        nproc=2,
        device="cpu",
        out_dir=out,
        max_lines=0,
        timeout=300,
    )
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "launch_cost")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    imports = {name: [] for name in {**IMPORTS, **CLIENT_IMPORTS}}
    launches = []
    for i in range(args.repeats):  # alternating, so background load hits every row alike
        for name, code in {**IMPORTS, **CLIENT_IMPORTS}.items():
            imports[name].append(seconds_to_import(code))
        launches.append(seconds_per_launch(args.out / f"repeat{i}"))
    load = max(load_before, os.getloadavg()[0])
    print(f"median of {args.repeats}, {os.cpu_count()} cores, load average {load:.1f}")
    base = statistics.median(imports["import torch"])
    for name, times in imports.items():
        median = statistics.median(times)
        versus = f"  ({median - base:+.2f} s over torch alone)" if name in IMPORTS else ""
        print(f"  {name:40} {median:5.2f} s{versus}")
    if importlib.util.find_spec("rfc3987_syntax") is None:
        print("  (rfc3987-syntax is not installed here: make setup removed it)")
    print(
        f"  {'one launch, 2 ranks, 1 step':40} {statistics.median(launches):5.2f} s  "
        f"(range {min(launches):.2f}-{max(launches):.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
