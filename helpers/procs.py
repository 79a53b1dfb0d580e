"""Process trees: find every process a job started, and end them all (psutil: Linux and macOS).

torchrun gives each worker its own session, and a papermill run owns a kernel that may own
workers, so "kill the process group" misses processes. Walking the tree from the job's PID
finds them all; a snapshot is taken before anything is killed, because orphans are re-parented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psutil

GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
RUN_MARKER = "MULTIGPU_LAB_RUN"  # environment variable naming the run a process belongs to


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except GONE:
        return []


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie waiting to be reaped counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # another user's process: it exists


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End torchrun and every worker: SIGTERM, a grace period, then SIGKILL for the rest.

    ``proc`` itself is waited for through ``Popen`` (so its exit code stays readable); the
    processes below it are not our children, and psutil watches them until they are gone.
    """
    tree = _existing(descendants(proc.pid))
    signal_all([proc.pid, *(p.pid for p in tree)], signal.SIGTERM)
    deadline = time.monotonic() + grace
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs(tree, timeout=max(0.0, deadline - time.monotonic()))
    late = _existing(descendants(proc.pid))  # started while the others were ending
    survivors = [*alive, *late]
    signal_all([proc.pid, *(p.pid for p in survivors)], signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(survivors, timeout=grace)


def _existing(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except GONE:
            continue
    return found


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment (empty when it is not ours to read, or already gone)."""
    try:
        return psutil.Process(pid).environ()
    except (*GONE, OSError):
        return {}


def live_processes(exclude_self: bool = True) -> Iterator[psutil.Process]:
    """Every process that is running now (zombies left out), for searches by marker or name."""
    for proc in psutil.process_iter():
        if exclude_self and proc.pid == os.getpid():
            continue
        if is_alive(proc.pid):
            yield proc


def with_environ(name: str, value: str) -> list[int]:
    """Live processes that inherited ``name=value``: a run's marker finds what it started."""
    return [p.pid for p in live_processes() if environ_of(p.pid).get(name) == value]
