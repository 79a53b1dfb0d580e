"""The torchrun jobs a notebook run started, read from the records they left in its folder.

On 2 CPU cores a launch spends 6-10 s before its first step and after its last (torchrun's agent
and every worker import torch, then tear down), so a quick-mode notebook's time is mostly its
launches. Every job leaves ``job.json`` in its own folder when it ends (helpers.launch), and a
notebook's jobs live under its run folder, so the runner counts them from the outside: how many
each notebook made and how long they took, which is what a team reading a slow nightly run
needs first; ``benchmarks/launch_cost.py --run`` turns it into the time no cut of training
steps can remove.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.launch import JOB_RECORD


def read(folder: str | Path) -> list[dict[str, Any]]:
    """The jobs recorded under ``folder``, in the order they started (none when there are none).

    A record that cannot be read (a job killed while writing it) is left out.
    """
    jobs = []
    for path in Path(folder).rglob(JOB_RECORD):
        try:
            jobs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(jobs, key=lambda j: j.get("started", 0.0))


def clear(folder: str | Path) -> None:
    """Forget an earlier run's jobs before the folder is used again."""
    for path in Path(folder).rglob(JOB_RECORD):
        path.unlink(missing_ok=True)


def groups(jobs: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """Jobs that ran at the same time (notebook 14's two agents) as one: each group's wall
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
