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
  the fixed cost of a launch, with the one step and the test pass it still does;
- an empty launch on 1 and on 2 ranks (a process group, one all_reduce, nothing else) and a
  papermill run of a one-cell notebook that imports torch: what no lesson can do without.

With ``--run runs/<time>`` it reads how many torchrun jobs each notebook of that run started
(the ``job.json`` each job leaves in its folder, labtools.ledger) and prints the run's floor:
one kernel per notebook plus one empty launch per job (jobs that ran at the same time count
once). No cut of training steps takes a notebook under its floor; only fewer launches or
cheaper imports do.

    .venv/bin/python benchmarks/launch_cost.py --repeats 5
    .venv/bin/python benchmarks/launch_cost.py --repeats 3 --run runs/latest
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

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from helpers import launch  # noqa: E402
from labtools import ledger, run_folder
from labtools.runner import kernel_name  # noqa: E402

DDP_SCRIPT = ROOT / "scripts" / "ddp_train.py"
ONE_STEP = ["--max-steps", "1", "--snapshot-steps"]

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


EMPTY_JOB = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
"""


def seconds_per_launch(script: Path, args: list[str], nproc: int, out: Path) -> float:
    """Wall seconds of one CPU launch of ``script``, start-up and teardown included."""
    started = time.perf_counter()
    launch.torchrun(script, args, nproc=nproc, device="cpu", out_dir=out, max_lines=0, timeout=300)
    return time.perf_counter() - started


def seconds_per_kernel(notebook: Path) -> float:
    """Wall seconds of papermill running a one-cell notebook that imports torch."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "papermill", str(notebook), str(notebook.with_suffix(".out.ipynb"))]
        + ["-k", kernel_name(), "--no-progress-bar"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def write_fixtures(out: Path) -> tuple[Path, Path]:
    """The empty job and the one-cell notebook, as files: torchrun and papermill take paths."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "empty_job.py"
    script.write_text(EMPTY_JOB)
    notebook = out / "import_torch.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch")]
    nbformat.write(nb, notebook)
    return script, notebook


def print_floor(run_dir: Path, kernel: float, empty: dict[int, float]) -> None:
    """Each notebook of the run: its time, its jobs, and the floor they set.

    A job costs at least an empty launch of its size, or what it took if it took less (a job
    that fails on purpose before its workers meet). Processes started other ways (DataLoader
    workers, mp.spawn, py-spy) are left out, so the true floor is higher still.
    """
    run = run_folder.load_run(run_dir)
    print(f"\n{run_dir.resolve().name}: each notebook's floor is one kernel ({kernel:.1f} s)")
    print("plus one empty launch per torchrun job (jobs at the same time count once)")
    print(f"  {'notebook':34} {'seconds':>8} {'jobs':>5} {'in jobs':>8} {'floor':>7}")
    total = floor_total = 0.0
    for name, nb in run.notebooks.items():
        jobs = ledger.read(nb.folder)
        floor = kernel + sum(min(span, empty[min(n, 2)]) for span, n in ledger.groups(jobs))
        seconds = nb.seconds or 0.0
        total, floor_total = total + seconds, floor_total + floor
        count, in_jobs = ledger.totals(jobs)
        print(f"  {name:34} {seconds:8.1f} {count:5d} {in_jobs:8.1f} {floor:7.1f}")
    print(f"  {'all':34} {total:8.1f} {'':5} {'':8} {floor_total:7.1f}")
    print(
        f"floor {floor_total:.0f} s of {total:.0f} s ({floor_total / total:.0%}); "
        f"the lessons' own work is the other {total - floor_total:.0f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "launch_cost")
    parser.add_argument("--run", type=Path, help="a run folder (runs/<time>) to print floors for")
    args = parser.parse_args()
    if args.run and not (args.run / "summary.json").exists():
        parser.error(f"{args.run} has no summary.json: pass a folder that `make run` wrote")
    script, notebook = write_fixtures(args.out)
    load_before = os.getloadavg()[0]
    imports = {name: [] for name in {**IMPORTS, **CLIENT_IMPORTS}}
    launches, kernels, empty = [], [], {1: [], 2: []}
    for i in range(args.repeats):  # alternating, so background load hits every row alike
        for name, code in {**IMPORTS, **CLIENT_IMPORTS}.items():
            imports[name].append(seconds_to_import(code))
        out = args.out / f"repeat{i}"  # notebook 02's script, one training step on 2 ranks
        launches.append(seconds_per_launch(DDP_SCRIPT, [*ONE_STEP, "--out", str(out)], 2, out))
        for nproc, times in empty.items():  # torchrun's price alone: the workers meet once
            times.append(seconds_per_launch(script, [], nproc, args.out / f"empty{nproc}-{i}"))
        kernels.append(seconds_per_kernel(notebook))
    load = max(load_before, os.getloadavg()[0])
    print(f"median of {args.repeats}, {os.cpu_count()} cores, load average {load:.1f}")
    base = statistics.median(imports["import torch"])
    for name, times in imports.items():
        median = statistics.median(times)
        versus = f"  ({median - base:+.2f} s over torch alone)" if name in IMPORTS else ""
        print(f"  {name:40} {median:5.2f} s{versus}")
    if importlib.util.find_spec("rfc3987_syntax") is None:
        print("  (rfc3987-syntax is not installed here: make setup removed it)")
    rows = {
        "one launch, 2 ranks, 1 step": launches,
        "an empty launch, 1 rank": empty[1],
        "an empty launch, 2 ranks": empty[2],
        "papermill, one cell: import torch": kernels,
    }
    for name, times in rows.items():
        print(
            f"  {name:40} {statistics.median(times):5.2f} s  "
            f"(range {min(times):.2f}-{max(times):.2f})"
        )
    if args.run:
        medians = {n: statistics.median(t) for n, t in empty.items()}
        print_floor(args.run, statistics.median(kernels), medians)
    return 0


if __name__ == "__main__":
    sys.exit(main())
