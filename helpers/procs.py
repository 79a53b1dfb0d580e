"""Process trees: find every process a job started, and end them all (psutil: Linux and macOS).

torchrun gives each worker its own session, and a papermill run owns a kernel that may own
workers, so "kill the process group" misses processes. Walking the tree from the job's PID
finds them all; a snapshot is taken before anything is killed, because orphans are re-parented.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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


def resident_bytes(pid: int) -> dict[int, int]:
    """Resident memory of ``pid`` and every live process below it, by pid."""
    found = {}
    for proc in _existing([pid, *descendants(pid)]):
        try:
            found[proc.pid] = proc.memory_info().rss
        except GONE:
            continue
    return found


def oom_killed(pid: int) -> bool:
    """True when the kernel's log says its OOM killer ended ``pid`` (False where the log cannot
    be read: ``dmesg`` needs privileges on most systems)."""
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(
        f"Killed process {pid} " in line or f"pid={pid}," in line and "oom-kill" in line
        for line in log.splitlines()
    )


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended since boot (Linux's /proc/vmstat,
    readable by anyone), or None where it is not counted."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


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


class LockHeld(OSError):
    """Another process holds the lock; ``pid`` is the one it wrote ("?" if it wrote none)."""

    def __init__(self, path: Path, pid: str):
        super().__init__(f"{path} is locked by pid {pid}")
        self.pid = pid


class PidLock:
    """A lock file that is this process's alone until ``release()`` or its end, and names it.

    The holder writes its pid into the file, so that the process that is refused can say who
    holds it. The kernel drops the lock when the holder ends, however it ends. ``per_process``:
    a POSIX record lock (``lockf``), which a child forked from the holder does not inherit (a
    kernel's DataLoader workers, a hung fork) and which the holder may take again; it is lost
    if the holder opens and closes the file a second time. Otherwise ``flock``: exclusive even
    between two opens in one process.
    """

    def __init__(self, path: Path, *, per_process: bool = False):
        self.path = path
        self._file = open(path, "a+")  # noqa: SIM115  held for the lock's life
        try:
            if per_process:
                fcntl.lockf(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN):  # no locks on this file system
                self._file.close()
                raise
            owner = self._owner()
            self._file.close()
            raise LockHeld(path, owner) from None
        self._file.truncate(0)
        self._file.write(str(os.getpid()))
        self._file.flush()

    def _owner(self, wait_s: float = 1.0) -> str:
        """The pid the holder writes just after taking the lock: a process that lost the race
        by a moment finds the file still empty, so it looks again for up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            self._file.seek(0)
            owner = self._file.read().strip()
            if owner or time.monotonic() > deadline:
                return owner or "?"
            time.sleep(0.01)

    def release(self) -> None:
        if not self._file.closed:
            self._file.close()  # closing drops the lock; the file stays, harmless
