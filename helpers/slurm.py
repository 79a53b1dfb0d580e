"""A Slurm cluster seen from a notebook: the one ``sinfo`` answers, and a job followed to its end.

The site's Slurm answers ``sinfo`` as it is; the kit's local cluster (``make slurm-up``,
``cluster/slurm/localcluster.py``) answers with its own ``SLURM_CONF``, which ``find`` adds.
The notebook itself runs ``sbatch``: only finding the cluster and watching ``squeue`` are here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import REPO_ROOT

LOCAL_CONF = REPO_ROOT / "cluster" / "slurm" / "local" / "etc" / "slurm.conf"  # make slurm-up's
NODE_FORMAT = "%N %T %c %G"  # name, state, CPUs, generic resources ("(null)": no GPU)


@dataclass
class Cluster:
    """A Slurm cluster that answered: its nodes and the environment its commands need."""

    env: dict[str, str]  # os.environ, plus SLURM_CONF for the kit's local cluster
    nodes: list[dict[str, str]]  # {"name", "state", "cpus", "gres"} per node, from sinfo
    local: bool  # the kit's own two-node cluster on this machine

    @property
    def cpus_per_node(self) -> int:
        return min(int(n["cpus"]) for n in self.nodes)

    @property
    def has_gpus(self) -> bool:
        return any("gpu" in n["gres"] for n in self.nodes)


def _sinfo(env: dict[str, str], timeout: float) -> list[dict[str, str]] | None:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", NODE_FORMAT],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return None
    keys = ("name", "state", "cpus", "gres")
    return [dict(zip(keys, row, strict=False)) for row in rows]


def find(timeout: float = 10) -> Cluster | None:
    """The Slurm cluster this machine can submit to, or None (no ``sinfo``, or no answer)."""
    if shutil.which("sinfo") is None:
        return None
    nodes = _sinfo(dict(os.environ), timeout)
    if nodes is not None:
        local = Path(os.environ.get("SLURM_CONF", "/")).resolve() == LOCAL_CONF
        return Cluster(dict(os.environ), nodes, local)
    if LOCAL_CONF.exists():
        env = {**os.environ, "SLURM_CONF": str(LOCAL_CONF)}
        nodes = _sinfo(env, timeout)
        if nodes is not None:
            return Cluster(env, nodes, True)
    return None


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job`` as a dict (JobState, Reason, ExitCode, Restarts ...); {} if gone."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    fields = {}
    for word in out.stdout.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def squeue_line(job_id: str, env: dict[str, str]) -> str:
    """The job's line in ``squeue`` (id, state, run time, nodes or why it waits); "" once gone."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%i %T %M %R"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip()


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def follow(
    job_id: str,
    env: dict[str, str],
    show: Callable[[str], None] = print,
    every: float = 2.0,
    timeout: float = 900,
    quiet_s: float = 15.0,
) -> dict[str, str]:
    """Watch a job until it ends: ``show`` its squeue line when its state or nodes change (and
    every ``quiet_s`` seconds meanwhile); return the job's final fields (``job_fields``).

    A job that Slurm requeues (a node failed, ``--requeue``) is PENDING again, not ended.
    """
    deadline, last, shown_at = time.monotonic() + timeout, None, 0.0
    while True:
        line = squeue_line(job_id, env)
        fields = job_fields(job_id, env)
        state = fields.get("JobState", "")
        words = line.split()
        key = (words[1], words[3:]) if len(words) > 3 else line  # state and nodes, not the time
        if line and (key != last or time.monotonic() - shown_at >= quiet_s):
            show(line)
            last, shown_at = key, time.monotonic()
        if state in FINAL or (not line and not fields):
            return fields
        if time.monotonic() > deadline:
            raise TimeoutError(f"Slurm job {job_id} still {state or '?'} after {timeout:.0f} s")
        time.sleep(every)
