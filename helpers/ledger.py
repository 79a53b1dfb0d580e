"""The torchrun jobs a notebook started during a run: one JSON line per job in its folder.

On 2 CPU cores a launch spends 6-10 s before its first step and after its last (torchrun's agent
and every worker import torch, then tear down), so a quick-mode notebook's time is mostly its
launches. The runner's table says how many each notebook made and how long they took, which is
what a team reading a slow nightly run needs first, and ``benchmarks/launch_cost.py --run``
turns it into the time no cut of training steps can remove.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from helpers.procs import RUN_MARKER

LEDGER = "launches.jsonl"


def record(entry: dict[str, Any]) -> None:
    """Add one finished job to the ledger of the run this process belongs to, if any.

    The runner marks each notebook's processes with its folder (``RUN_MARKER``); a notebook run
    by hand has no marker and keeps no ledger.
    """
    folder = os.environ.get(RUN_MARKER)
    if folder and Path(folder).is_dir():
        with open(Path(folder) / LEDGER, "a") as ledger:  # one short append per job
            ledger.write(json.dumps(entry) + "\n")


def read(folder: str | Path) -> list[dict[str, Any]]:
    """The jobs recorded in ``folder``, in the order they ended (none when there is no ledger)."""
    path = Path(folder) / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def clear(folder: str | Path) -> None:
    """Forget an earlier run's jobs before the folder is used again."""
    (Path(folder) / LEDGER).unlink(missing_ok=True)


def groups(jobs: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """Jobs that ran at the same time (notebook 09's two agents) as one: each group's wall
    seconds and its largest nproc, in the order they started."""
    found: list[list[float]] = []  # [start, end, nproc]
    for job in sorted(jobs, key=lambda j: j["started"]):
        end = job["started"] + job["seconds"]
        if found and job["started"] < found[-1][1]:
            found[-1][1:] = [max(found[-1][1], end), max(found[-1][2], job["nproc"])]
        else:
            found.append([job["started"], end, job["nproc"]])
    return [(end - start, int(nproc)) for start, end, nproc in found]


def totals(jobs: list[dict[str, Any]]) -> tuple[int, float]:
    """How many jobs a notebook started, and the wall seconds during which any ran."""
    return len(jobs), round(sum(span for span, _ in groups(jobs)), 2)
