"""Reproduce failures on purpose and keep the proof: the plumbing of the troubleshooting lesson.

A reproduced error has two readers. The learner must see the real traceback in the cell, and
the record must say which error was seen, so that a test can check the lesson reproduced what it
claims. ``Cases.expect`` serves both: it catches *only* the expected error, records it and prints
its full traceback (red, on stderr). The notebook then goes on, so "Run All" in JupyterLab
(which stops at the first raising cell), nbconvert and papermill (which fail a run on any error
output, even in a cell tagged ``raises-exception``) all get through the lesson. Any other
error, or no error at all, still fails the cell. ``reraise=True`` lets the expected error
through as well.

Failures that would hang or crash the notebook kernel run in a *fresh* Python started by
``run_fresh`` (never a fork of the kernel), with a time limit that ends its whole process tree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from helpers.messages import _
from helpers.procs import GONE, RUN_MARKER, environ_of, kill_tree, live_processes


class NotReproduced(AssertionError):
    """The code that should have failed did not: the lesson's claim is not shown on this machine."""


class ChildFailed(RuntimeError):
    """A fresh process exited non-zero; the message ends with that process's own error text."""

    def __init__(self, message: str, returncode: int, output: str):
        super().__init__(message)
        self.returncode = returncode
        self.output = output


class ChildTimeout(TimeoutError):
    """A fresh process ran past its limit and was ended with everything it started."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def _short(exc: BaseException, match: str | None = None, limit: int = 300) -> str:
    """``Type: the line that says what went wrong``: the last line matching ``match``, else the
    last line mentioning an error (a log can end in noise after the real error, such as a
    process aborting while it shuts down)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    hits = [ln for ln in lines if match and re.search(match, ln)]
    hits = hits or [ln for ln in lines if re.search(r"(?i)error|exception|timed? ?out", ln)]
    line = (hits or lines or [""])[-1]
    return f"{type(exc).__name__}: {line}"[:limit]


class Cases:
    """The troubleshooting record: case -> "reproduced", "skipped: why" or what went wrong.

    ``errors`` keeps the one-line error each reproduction raised, ``seen`` the exception itself
    (and ``raised_at`` when it arrived) so a later cell can read details from it, and
    ``seconds`` how long the reproduction took to fail: a hang that became an error shows here.
    """

    def __init__(self, rec: Any | None = None, reraise: bool = False):
        self.rec = rec
        self.reraise = reraise
        self.outcomes: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.seen: dict[str, BaseException] = {}
        self.raised_at: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    @contextmanager
    def expect(
        self,
        case: str,
        error: type[BaseException] | tuple[type[BaseException], ...],
        match: str | None = None,
    ) -> Iterator[None]:
        """Run a reproduction: the expected error is recorded and its traceback printed.

        Any other error (or one whose text does not match ``match``) is recorded as
        "unexpected: ..." and raised; no error at all raises ``NotReproduced``, so a lesson never
        claims a failure it did not show.
        """
        start = time.time()
        try:
            yield
        except error as exc:
            short = _short(exc, match)
            self.seen[case], self.raised_at[case] = exc, time.time()
            self.seconds[case] = self.raised_at[case] - start
            if match and not re.search(match, f"{type(exc).__name__}: {exc}"):
                self.outcomes[case] = f"unexpected: {short}"
                print(
                    _("UNEXPECTED [{case}]: the error does not match {match}").format(
                        case=case, match=repr(match)
                    )
                )
                raise
            self.outcomes[case] = "reproduced"
            self.errors[case] = short
            print(_("REPRODUCED [{case}] {error}").format(case=case, error=short), flush=True)
            if self.reraise:
                raise
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
        except BaseException as exc:
            self.seen[case], self.raised_at[case] = exc, time.time()
            self.seconds[case] = self.raised_at[case] - start
            self.outcomes[case] = f"unexpected: {_short(exc)}"
            print(
                _("UNEXPECTED [{case}]: expected {expected}, got {got}").format(
                    case=case, expected=error, got=type(exc).__name__
                )
            )
            raise
        else:
            self.outcomes[case] = "not reproduced: no error was raised"
            raise NotReproduced(f"{case}: the reproduction ran without the expected error")

    def skip(self, case: str, why: str) -> None:
        """A case this machine cannot reproduce: said loudly and kept in the record's skips."""
        self.outcomes[case] = f"skipped: {why}"
        if self.rec is not None:
            self.rec.skip(case, why)
        else:
            print(_("SKIPPED: {what} -- {why}").format(what=case, why=why))

    @property
    def reproduced(self) -> int:
        return sum(v == "reproduced" for v in self.outcomes.values())


def run_fresh(
    argv: Sequence[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    tail: int = 12,
) -> str:
    """Run ``argv`` as a new process (not a fork of this kernel) and return its output.

    Exit code non-zero -> ``ChildFailed`` whose message is the last ``tail`` lines of the
    output (where Python puts the error). Past ``timeout`` -> the process tree is ended and
    ``ChildTimeout`` is raised. Either way nothing is left running.
    """
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        try:  # retrying communicate() loses none of what was printed before the limit
            output = proc.communicate(timeout=5)[0]
        except subprocess.TimeoutExpired:  # something outside the tree still holds the pipe
            output = ""
        raise ChildTimeout(
            f"{' '.join(argv[:3])} ... ran past {timeout:.0f} s and was ended", output
        ) from None
    except BaseException:  # an interrupted cell must not leave the child running
        kill_tree(proc)
        raise
    if proc.returncode != 0:
        lines = [ln for ln in output.rstrip().splitlines() if ln.strip()]
        raise ChildFailed(
            f"exit code {proc.returncode}; the last lines it printed:\n" + "\n".join(lines[-tail:]),
            proc.returncode,
            output,
        )
    return output


def port_owners(port: int) -> list[int]:
    """PIDs holding a TCP socket on ``port`` (listening or connected): what ``lsof -i :PORT`` /
    ``fuser PORT/tcp`` tell, also where neither tool is installed. Processes of other users are
    invisible without root, exactly as with ``lsof``."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:  # macOS without root: ask process by process
        conns = [c for p in live_processes(exclude_self=False) for c in _tcp_of(p)]
    return sorted({c.pid for c in conns if c.pid and c.laddr and c.laddr.port == port})


def _tcp_of(proc: psutil.Process) -> list:
    try:
        return [c._replace(pid=proc.pid) for c in proc.net_connections(kind="tcp")]
    except GONE:
        return []


def describe(pid: int) -> dict[str, Any]:
    """Who a process belongs to and what it is: the facts to check before ending it.

    ``run`` is the ``MULTIGPU_LAB_RUN`` marker it inherited, if any: on a machine where everyone
    is the same user (root in a container), the marker, not the uid, says whose process it is.
    """
    proc = psutil.Process(pid)
    with proc.oneshot():
        return {
            "pid": pid,
            "ppid": proc.ppid(),
            "uid": proc.uids().real,
            "rss_mib": proc.memory_info().rss // 2**20,
            "cmdline": " ".join(proc.cmdline()),
            "run": environ_of(pid).get(RUN_MARKER),
        }


def processes_matching(text: str, run: str | None = None) -> list[int]:
    """Live processes (zombies excluded) whose command line contains ``text``; with ``run``,
    only those that inherited ``MULTIGPU_LAB_RUN=run`` (this run's, not a colleague's)."""
    found = []
    for proc in live_processes():
        try:
            cmdline = " ".join(proc.cmdline())
        except GONE:
            continue
        if text in cmdline and (run is None or environ_of(proc.pid).get(RUN_MARKER) == run):
            found.append(proc.pid)
    return found
