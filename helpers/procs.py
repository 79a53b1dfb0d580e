"""Process trees: find every process a job started, and end them all.

torchrun gives each worker its own session, and a papermill run owns a kernel that may own
workers, so "kill the process group" misses processes. Walking /proc from the job's PID finds
them all; a snapshot is taken before anything is killed, because orphans are re-parented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Linux /proc; empty elsewhere)."""
    if not Path("/proc").is_dir():
        return []
    tree, found, todo = _children_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie waiting to be reaped counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End torchrun and every worker: SIGTERM, a grace period, then SIGKILL for the rest."""
    pids = [proc.pid, *descendants(proc.pid)]
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        proc.poll()
        time.sleep(0.05)
    signal_all([p for p in pids + descendants(proc.pid) if is_alive(p)], signal.SIGKILL)
    proc.wait()


def environ_of(pid: int) -> dict[str, str]:
    """A process's environment (empty when it is not ours to read, or already gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
