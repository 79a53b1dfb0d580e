"""Run a training script under torchrun from a notebook cell, and always clean up after it.

Why not ``mp.spawn``: a function defined in a notebook cannot be unpickled by spawned children,
and forking a kernel that already ran torch ops hangs in OpenMP. torchrun starts fresh
processes from a script file, which is how the job will run on a cluster too.

torchrun puts each worker in its own session, so killing torchrun's process group is not
enough: the launcher snapshots the whole process tree and ends every process in it, on
success, crash, timeout, kernel interrupt and the Stop button alike.

What the ranks print goes to a view (``helpers.live``): in JupyterLab a bar per rank, the log in
rank colours and a Stop button; headless, the lines themselves and a summary at the end.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from helpers.env import device_plan, gpu_info, port_is_free
from helpers.messages import _
from helpers.paths import REPO_ROOT
from helpers.procs import (
    LockHeld,
    PidLock,
    descendants,
    is_alive,
    kill_tree,
    oom_killed,
    oom_kills,
    resident_bytes,
    signal_all,
)
from helpers.progress import RANK_TAG  # how each line shown says which rank printed it

OUT_ENV = "MULTIGPU_LAB_OUT"  # where each rank writes rank{RANK}.json
JOB_RECORD = "job.json"  # in each job's folder once it ended: script, ranks, seconds, status
_PREFIX = re.compile(r"^\[default(\d+)\]:(?:\[rank(\d+)\]: ?)?")  # torch's own tag, once
_ANY_PREFIX = re.compile(r"(\[default\d+\]:)")
_RANK_PAIR = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")  # torchrun's summary
_ROOT_CAUSE = re.compile(r"Root Cause.*?" + _RANK_PAIR.pattern, re.S)
_TORCH_TAG = re.compile(r"^\[rank\d+\]: ?", re.M)  # torch's excepthook, once a group exists
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_PID = re.compile(r"exitcode\s*:\s*-?\d+ \(pid: (\d+)\)")
_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\)")
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)(:|$)")  # "ValueError: ..."
_USAGE = re.compile(r"^\S+: error: (.+)$", re.M)  # argparse refusing torchrun's arguments
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_BANNER = ("*****", "Setting OMP_NUM_THREADS environment variable")
_LIVE: set[Job] = set()


class LaunchError(RuntimeError):
    """A torchrun job could not start or did not finish; the message says why and what to do."""


class TooManyProcesses(LaunchError):
    pass


class PortInUse(LaunchError):
    pass


class LaunchTimeout(LaunchError):
    pass


class JobStopped(LaunchError):
    """The learner pressed Stop: torchrun and every worker were ended."""


class WorkerFailed(LaunchError):
    """A rank exited non-zero; ``rank`` and ``traceback`` name the root cause."""

    def __init__(self, message: str, rank: int | None, traceback: str, result: LaunchResult):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.result = result


@dataclass
class RecordedFailure:
    """One worker's error.json: what ``@record`` wrote when an exception ended that worker."""

    local_rank: int
    written_ns: int  # when the file was written, to the nanosecond
    message: str
    traceback: str


def recorded_failures(log_dir: Path) -> list[RecordedFailure]:
    """The error.json files of torchrun's last attempt, the first one written first.

    torchrun points each worker's TORCHELASTIC_ERROR_FILE at
    ``<log_dir>/<run id>/attempt_<n>/<local rank>/error.json``, and a worker whose entry point
    is wrapped in ``torch.distributed.elastic.multiprocessing.errors.record`` writes the
    exception that ended it there: structured, unlike the summary torchrun prints. The first
    file written is the root cause: the others are ranks that lost their peer when it died
    ("Connection closed by peer"), which happens after its file was written. The files' own
    timestamps count whole seconds, so two of them often tie (torchrun's summary then names the
    lower rank, right or wrong); the files' modification times do not. A worker that was
    killed, or left through ``os._exit``, writes nothing. Earlier attempts are ignored: with
    ``--max-restarts`` their failures were recovered from.
    """
    runs = sorted((p for p in log_dir.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    attempts = runs and sorted(runs[-1].glob("attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    found = []
    for path in attempts[-1].glob("*/error.json") if attempts else ():
        try:
            entry = json.loads(path.read_text())["message"]
            callstack = entry["extraInfo"]["py_callstack"].strip()
            written = path.stat().st_mtime_ns
            found.append(
                RecordedFailure(int(path.parent.name), written, entry["message"], callstack)
            )
        except (ValueError, KeyError, TypeError):
            continue  # half-written, or not @record's format: the log still tells the failure
    return sorted(found, key=lambda f: (f.written_ns, f.local_rank))


def machine_memory() -> tuple[int, int]:
    """(available, total) bytes of this machine's memory now (psutil)."""
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass
class MemoryUse:
    """What a job's processes held, sampled while it ran, against what the machine had.

    A rank the kernel's OOM killer ends dies by SIGKILL with no word of memory; these figures
    (and the kernel's log, where it can be read) tell that death from a ``kill -9``.
    """

    available_at_start: int
    total: int
    peaks: dict[int, int] = field(default_factory=dict)  # pid -> most resident bytes seen
    peak_job: float = 0  # most resident bytes of the whole tree at one sample
    least_available: float = float("inf")
    oom_kills_at_start: int | None = field(default_factory=oom_kills)
    _sampled: float = 0.0  # time.monotonic() of the last sample

    def sample(self, root: int, every_s: float = 0.25) -> None:
        """Read the tree's memory, at most every ``every_s`` (a chatty job wakes the loop often)."""
        if time.monotonic() - self._sampled < every_s:
            return
        self._sampled = time.monotonic()
        held = resident_bytes(root)
        for pid, rss in held.items():
            self.peaks[pid] = max(rss, self.peaks.get(pid, 0))
        self.peak_job = max(self.peak_job, sum(held.values()))
        self.least_available = min(self.least_available, machine_memory()[0])

    def out_of_memory(self, pid: int | None) -> str | None:
        """Why a SIGKILL of ``pid`` was probably the OOM killer's, with the figures, or None.

        Memory points at it when the kernel's log or its count of OOM kills says so (a sudden
        allocation can come between two samples), when the job held half of what was available
        when it started, or when the machine had under 5 % of its memory left.
        """
        now = oom_kills()
        counted = None not in (now, self.oom_kills_at_start) and now > self.oom_kills_at_start
        killed = pid is not None and oom_killed(pid)
        pressed = self.peak_job >= self.available_at_start / 2
        if not (killed or counted or pressed or self.least_available <= self.total / 20):
            return None
        figures = _(
            "it peaked at {rank} and the job at {job}, with {available} of {total} available "
            "when it started"
        ).format(
            rank=_size(self.peaks.get(pid, 0)) if pid in self.peaks else "?",
            job=_size(self.peak_job),
            available=_size(self.available_at_start),
            total=_size(self.total),
        )
        if killed or counted:
            figures += _("; the kernel's OOM killer ended a process meanwhile")
        return _("probably out of memory: {figures}").format(figures=figures)


@dataclass
class LaunchResult:
    returncode: int
    seconds: float
    log: str
    out_dir: Path
    outputs: dict[int, Any] = field(default_factory=dict)  # rank -> the JSON it wrote

    def rank(self, rank: int = 0) -> Any:
        if rank not in self.outputs:
            raise KeyError(
                _("rank {rank} wrote no {out}/rank{rank}.json; ranks that did: {ranks}").format(
                    rank=rank, out=OUT_ENV, ranks=sorted(self.outputs)
                )
            )
        return self.outputs[rank]


def write_rank_output(data: dict[str, Any], rank: int | None = None) -> Path | None:
    """Called inside a worker: leave this rank's results where the launcher will collect them."""
    out = os.environ.get(OUT_ENV)
    if not out:
        return None
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    path = Path(out) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: a reader never sees half a file
    return path


def exit_without_teardown(code: int = 0) -> NoReturn:
    """Called inside a worker whose work is done and whose group is destroyed: leave now.

    A DeviceMesh, DTensor or fully_shard model keeps gloo's process group alive past
    ``destroy_process_group()`` (references the script cannot drop), so gloo's threads outlive
    it; if one frees a tensor while the interpreter shuts down, the worker aborts ("terminate
    called without an active exception", or a segfault) after its results were written, and
    the job fails (CONTRIBUTING.md, "Why the scripts import torch.distributed.nn first").
    Leaving without the interpreter's teardown skips that race; nothing is left to clean up.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------- the job


def worker_env(device: str) -> dict[str, str]:
    """Environment that makes workers compute where the plan says.

    CUDA workers number GPUs in PCI order, as nvidia-smi and ``helpers.env`` do (CUDA's default
    puts the fastest first); CPU workers see no GPU, so a script that asks
    ``torch.cuda.is_available()`` stays on the CPU even on a GPU machine.
    """
    if device == "cuda":
        return {"CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}
    return {"CUDA_VISIBLE_DEVICES": ""}


def threads_per_rank(nproc: int) -> int:
    """This machine's cores shared out between ``nproc`` workers, at least one each.

    torchrun gives every worker one thread when it starts several (cores idle on a big machine);
    PyTorch alone gives every process all cores (N processes oversubscribe them N times).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // nproc)


def check_nproc(nproc: int, device: str) -> None:
    """Refuse a world size the hardware cannot hold, before anything starts."""
    if nproc < 1:
        raise TooManyProcesses(_("nproc must be at least 1, got {nproc}.").format(nproc=nproc))
    if device == "cuda":
        gpus = gpu_info().count
        if nproc > gpus:
            raise TooManyProcesses(
                _(
                    "Asked for {nproc} processes but only {gpus} GPU(s) are visible; one process "
                    "per GPU is the rule. Use nproc<={gpus}, or device='cpu' to practise with gloo."
                ).format(nproc=nproc, gpus=gpus)
            )
    else:
        limit = 2 * (os.cpu_count() or 1)
        if nproc > limit:
            raise TooManyProcesses(
                _(
                    "Asked for {nproc} CPU processes on {cores} cores; above {limit} they "
                    "only fight for cores. Use nproc<={limit}."
                ).format(nproc=nproc, cores=os.cpu_count(), limit=limit)
            )


_EXAMPLE = {"port": "None", "max_restarts": 0}  # what to pass instead of a bad value


def _count(name: str, value: Any, least: int, error: type[LaunchError] = LaunchError) -> None:
    """Refuse a count that is not a whole number >= least (True and "2" are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise error(
            _(
                "{name} must be a whole number, at least {least}, got {value!r}; pass e.g. "
                "{name}={example}."
            ).format(name=name, least=least, example=_EXAMPLE.get(name, 2), value=value)
        )


def check_timeout(timeout: Any) -> None:
    """Refuse a time limit that is not a number of seconds above 0 (True is not one)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise LaunchError(
            _(
                "timeout must be a number of seconds above 0, got {value!r}; pass e.g. timeout=600."
            ).format(value=timeout)
        )


def check_options(*, nnodes: Any, max_restarts: Any, port: Any, max_lines: Any) -> None:
    """Refuse a launcher argument torchrun would choke on, before anything starts."""
    if not (isinstance(nnodes, str) and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", nnodes)):
        _count("nnodes", nnodes, 1)  # torchrun also takes "2" or a range "1:2"
    _count("max_restarts", max_restarts, 0)
    _count("max_lines", max_lines, 0)
    if port is not None:
        _count("port", port, 1)
        if port > 65535:
            raise LaunchError(_("port must be at most 65535, got {port}.").format(port=port))


class PortLock:
    """An explicit port, ours alone while the job lives: one lock file per port.

    torchrun's agent must bind the port itself, so the launcher cannot hold the socket; two
    launches on one port would otherwise both see it free and the second agent would join the
    first job's rendezvous. ``flock`` is exclusive between processes and between two opens in
    one process, and the kernel drops it if this process dies.
    """

    def __init__(self, port: int):
        self.path = Path(tempfile.gettempdir()) / f"multigpu-lab-port-{port}.lock"
        try:
            self._lock = PidLock(self.path)
        except LockHeld as held:
            raise PortInUse(
                _(
                    "Port {port} is in use by another launch (pid {pid}); pass port=None to "
                    "pick a free one."
                ).format(port=port, pid=held.pid)
            ) from None

    def release(self) -> None:
        self._lock.release()


def _torchrun_argv(script: Path, args: list[str], nproc: int, opts: dict[str, Any]) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "helpers.torchrun",  # torchrun, with a race in its agent closed: see that module
        f"--nproc-per-node={nproc}",
        "--tee=3",
        f"--log-dir={opts['log_dir']}",
        f"--max-restarts={opts['max_restarts']}",
    ]
    if opts["rdzv_endpoint"]:
        argv += [
            f"--nnodes={opts['nnodes']}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={opts['rdzv_endpoint']}",
            f"--rdzv-id={opts['rdzv_id']}",
        ]
    elif opts["port"] is not None:
        argv += [
            "--nnodes=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{opts['port']}",
            f"--rdzv-id={opts['rdzv_id']}",
        ]
    else:
        argv.append("--standalone")  # c10d on localhost:0: the OS picks a free port, no race
    return argv + [*opts["torchrun_args"], str(script), *[str(a) for a in args]]


# What the launcher adds for itself (its log folder, every rank's output teed, no restart):
# a learner's own torchrun line has no need of them, so the echoed command leaves them out.
_OWN_FLAGS = ("--tee=", "--log-dir=", "--max-restarts=0")


def command_line(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    """The torchrun command a learner would type, with the variables the caller set in front.

    The kit runs ``python -m helpers.torchrun`` (torchrun with one race closed: see that module)
    with its own log flags; the line shown is plain ``torchrun`` with the flags that matter
    (ranks, rendezvous, restarts) and the script's path from ``cwd`` (the run folder).
    """
    words = ["python" if w == sys.executable else w for w in argv]
    if "helpers.torchrun" in words:
        at = words.index("helpers.torchrun")
        words[at - 2 : at + 1] = ["torchrun"]  # python -m helpers.torchrun
    words = [w for w in words if not w.startswith(_OWN_FLAGS)]
    if cwd is not None:
        words = [_from(cwd, w) for w in words]
    assignments = [f"{k}={shlex.quote(v)}" for k, v in env.items()]  # quote the value only
    return " ".join([*assignments, shlex.join(words)])


def _from(cwd: Path, word: str) -> str:
    """A path below ``cwd`` as the learner sees it there (``work/ddp.py``); anything else as is."""
    path = Path(word)
    if not path.is_absolute() or not path.is_relative_to(cwd.resolve()):
        return word
    return str(path.relative_to(cwd.resolve()))


def unglue(line: str) -> list[str]:
    """The worker lines in one line of torchrun's ``--tee`` output.

    torchrun copies each worker's log to its own stdout line by line, prefixed ``[defaultN]:``;
    when it reads a line the worker has only half written, it copies that half, and the rest
    follows later with the prefix again but no newline in between:
    ``[default1]:progress: step 45/63 ...[default1]:``. Fragments of one worker are joined
    again; another worker's line in between becomes a line of its own.
    """
    parts = _ANY_PREFIX.split(line)
    if len(parts) == 1 or len(parts) == 3 and not parts[0]:  # the usual case: one whole line
        return [line]
    found = [parts[0]] if parts[0] else []
    where: dict[str, int] = {}  # prefix -> its worker's line in found
    for prefix, text in zip(parts[1::2], parts[2::2], strict=True):
        if prefix in where:
            found[where[prefix]] += text
        else:
            where[prefix] = len(found)
            found.append(prefix + text)
    return found


def rank_tagged(line: str) -> str:
    """``[default1]:text`` as ``[rank1] text``, the tag the view colours by.

    A worker's uncaught exception already says ``[rank1]: Traceback ...`` (torch's excepthook
    once the process group exists, with the global rank): that tag is kept, not doubled.
    """
    return _PREFIX.sub(lambda m: f"[rank{m.group(2) or m.group(1)}] ", line)


class Job:
    """A running torchrun job whose output is streamed into the cell that waits on it."""

    def __init__(
        self,
        script: str | Path,
        args: list[str] | tuple = (),
        *,
        nproc: int | None = None,
        device: str | None = None,
        out_dir: str | Path | None = None,
        port: int | None = None,
        nnodes: int | str = 1,
        rdzv_endpoint: str | None = None,
        rdzv_id: str = "multigpu-lab",
        max_restarts: int = 0,
        env: dict[str, str] | None = None,
        torchrun_args: list[str] | tuple = (),
        max_lines: int = 200,
        prefix: list[str] | None = None,
        view: Any = None,  # a helpers.live view; default: live in JupyterLab, else printed
    ):
        self.script = Path(script).resolve()
        if not self.script.is_file():
            raise FileNotFoundError(
                _(
                    "{script} does not exist: run the %%writefile cell that creates it first."
                ).format(script=self.script)
            )
        plan = device_plan()
        self.device = device or plan["worker_device"]
        if nproc is None:  # one per GPU, or 2 gloo processes; 0 is refused, never "default"
            nproc = plan["nproc"] if self.device == plan["worker_device"] else 2
        self.nproc, self.nnodes = nproc, nnodes
        _count("nproc", nproc, 1, TooManyProcesses)
        check_nproc(self.nproc, self.device)
        check_options(nnodes=nnodes, max_restarts=max_restarts, port=port, max_lines=max_lines)
        self._port_lock = PortLock(port) if port is not None else None
        if port is not None and not port_is_free(port):
            self._port_lock.release()
            raise PortInUse(
                _(
                    "Port {port} is already in use (another job, or a worker left "
                    "running?). Pass port=None to let the launcher pick a free one, or "
                    "find the owner with `lsof -i :{port}` / `fuser {port}/tcp`."
                ).format(port=port)
            )
        try:  # an explicit port stays locked only while a job runs on it
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.out_dir = Path(  # by default in the working folder: a notebook's run folder
                out_dir
                or Path("work")
                / "launch"
                / f"{self.script.stem}-{stamp}-{os.getpid()}-{id(self) & 0xFFFF:x}"
            ).resolve()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.out_dir.glob("rank*.json"):
                stale.unlink()
            opts = {
                "log_dir": self.out_dir / "torchrun_logs",
                "max_restarts": max_restarts,
                "rdzv_endpoint": rdzv_endpoint,
                "nnodes": nnodes,
                "rdzv_id": rdzv_id,
                "port": port,
                "torchrun_args": list(torchrun_args),
            }
            # e.g. ["ip", "netns", "exec", "host1"]: run the agent inside another network namespace
            self.argv = [
                *(prefix or []),
                *_torchrun_argv(self.script, list(args), self.nproc, opts),
            ]
            self.max_lines = max_lines
            self.lines: list[str] = []
            self._shown = 0
            self._agent_failing = False
            self._queue: queue.Queue[str | None] = queue.Queue()
            self._stop_requested = threading.Event()  # set by the Stop button's thread
            self._status: str | None = None  # why the job ended, when not by itself
            self.view = view or _default_view(self)
            if max_lines > 0:  # the command a learner could type: no hidden launcher magic
                self.view.show(["$ " + command_line(self.argv, env or {}, Path.cwd())])
            self._start, self._started_at = time.perf_counter(), time.time()
            self.memory = MemoryUse(*machine_memory())
            child_env = {
                "OMP_NUM_THREADS": str(threads_per_rank(self.nproc)),  # unless already set
                **os.environ,
                **worker_env(self.device),
                **(env or {}),
                OUT_ENV: str(self.out_dir),
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
                ),
            }
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env,
                text=True,
                errors="replace",
                start_new_session=True,
                bufsize=1,
                cwd=self.script.parent,
            )
            _LIVE.add(self)
            threading.Thread(target=self._pump, daemon=True).start()
        except BaseException:
            if self._port_lock:
                self._port_lock.release()
            raise

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def worker_pids(self) -> list[int]:
        """PIDs of the live processes under torchrun (for py-spy, or to check for orphans)."""
        return [p for p in descendants(self.proc.pid) if is_alive(p)]

    def _show(self, lines: list[str]) -> None:
        shown = []
        for line in (part for glued in lines for part in unglue(glued)):
            ranked = _PREFIX.match(line)
            line = rank_tagged(line)
            self.lines.append(line)
            if not ranked and line.startswith("Traceback"):
                self._agent_failing = True  # torchrun's own traceback: the exception says it
            if self._agent_failing and not ranked or line.startswith(_BANNER) or not line.strip():
                continue
            if self.view.progress(line):  # a progress line moves its rank's bar instead
                continue
            self._shown += 1
            if self._shown <= self.max_lines:
                shown.append(line)
            elif self._shown == self.max_lines + 1 and self.max_lines > 0:
                shown.append(
                    _("... more output is in {log}").format(log=self.out_dir / "torchrun.log")
                )
        if shown:  # one update per batch keeps the notebook's message rate low
            self.view.show(shown)

    def _drain(self, block_for: float) -> bool:
        """Show what arrived; False once torchrun's output has ended."""
        batch, done = [], False
        try:
            item = self._queue.get(timeout=block_for)
            while True:
                if item is None:
                    done = True
                    break
                batch.append(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        self._show(batch)
        return not done

    def wait(self, timeout: float = 600) -> LaunchResult:
        """Stream output until the job ends; raise with the reason if it did not succeed."""
        check_timeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while self._drain(block_for=0.5):
                self.view.tick()  # the live view's clock runs on while a job is silent
                self.memory.sample(self.proc.pid)  # what the ranks hold, should one be killed
                if self._stop_requested.is_set():
                    self._status = "stopped"
                    self.stop()
                    raise JobStopped(self._stopped_message())
                if time.monotonic() > deadline:
                    self._status = f"timed out ({timeout:.0f} s limit)"
                    self.stop()
                    raise LaunchTimeout(self._timeout_message(timeout))
            self.proc.wait()
        except KeyboardInterrupt:
            self._status = "interrupted"
            self.stop()
            print(_("Interrupted: torchrun and all its workers were stopped."))
            raise
        finally:
            self._close()
        return self._result()

    def request_stop(self) -> None:
        """Ask the cell waiting in ``wait`` to stop the job (the Stop button; any thread)."""
        self._stop_requested.set()

    def _stopped_message(self) -> str:
        return (
            f"Stopped with the Stop button after {time.perf_counter() - self._start:.0f} s: "
            f"torchrun and all its workers were ended, nothing is left running. The cells "
            f"below need this job's results: run this cell again."
        )

    def _timeout_message(self, timeout: float) -> str:
        tail = "\n".join(
            [ln for ln in self.lines if ln.strip() and not ln.startswith(_BANNER)][-15:]
        )
        return _(
            "torchrun ran past its {timeout:.0f} s limit and was stopped with all its "
            "workers. A rank may be stuck in a collective the others never reached; set "
            "the timeout in init_process_group and see notebook 13.\nLast output:\n{tail}"
        ).format(timeout=timeout, tail=tail)

    def stop(self) -> None:
        """End torchrun and every worker it started (safe to call twice)."""
        if self.proc.poll() is None or self.worker_pids():
            kill_tree(self.proc)
        self._close()

    def _close(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc)
        else:  # torchrun is gone; make sure nothing it started lingers
            signal_all(self.worker_pids(), signal.SIGKILL)
        if self._port_lock:
            self._port_lock.release()  # after every process that could hold the port ended
        first = self in _LIVE  # stop() and wait() both close; the job ends once
        _LIVE.discard(self)
        (self.out_dir / "torchrun.log").write_text("\n".join(self.lines) + "\n")
        code = self.proc.returncode
        ended = "finished" if code == 0 else f"failed (exit code {code})"
        seconds = time.perf_counter() - self._start
        self.view.finish(self._status or ended, seconds)
        if first:
            record = {
                "script": self.script.name,
                "nproc": self.nproc,
                "nnodes": str(self.nnodes),
                "started": round(self._started_at, 2),  # wall clock: jobs that overlap
                "seconds": round(seconds, 2),
                "status": self._status or ended,
                "progress_ranks": sorted(self.view.ranks),  # ranks that drew a bar
            }
            written = self.out_dir / (JOB_RECORD + ".tmp")
            written.write_text(json.dumps(record) + "\n")
            written.replace(self.out_dir / JOB_RECORD)  # whole or not at all

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _result(self) -> LaunchResult:
        outputs = {}
        for path in sorted(self.out_dir.glob("rank*.json")):
            outputs[int(path.stem[4:])] = json.loads(path.read_text())
        result = LaunchResult(
            self.proc.returncode,
            time.perf_counter() - self._start,
            "\n".join(self.lines),
            self.out_dir,
            outputs,
        )
        if result.returncode != 0:
            rank, cause, tb = self._root_cause()
            raise WorkerFailed(
                _("torchrun exited with code {code}: {cause}\n{tb}\nFull log: {log}").format(
                    code=result.returncode, cause=cause, tb=tb, log=self.out_dir / "torchrun.log"
                ),
                rank,
                tb,
                result,
            )
        return result

    def _root_cause(self) -> tuple[int | None, str, str]:
        log = "\n".join(self.lines)
        return read_cause(self.out_dir, log, self.nnodes, self.proc.returncode, self.memory)


def _last_error(text: str) -> str | None:
    """The last "SomeError: ..." line of a traceback or a compile error."""
    found = [ln.strip() for ln in text.splitlines() if _ERROR_LINE.match(ln.strip())]
    return found[-1] if found else None


def _agent_error(log: str) -> str | None:
    """The exception that ended torchrun itself (not a worker's, not ChildFailedError)."""
    own = [ln for ln in log.splitlines() if not RANK_TAG.match(ln)]
    if "Traceback" not in "\n".join(own):
        return None
    tail = "\n".join(own[max(i for i, ln in enumerate(own) if ln.startswith("Traceback")) :])
    error = _last_error(tail)
    return None if error is None or "ChildFailedError" in error else error


def read_cause(
    out_dir: Path,
    log: str,
    nnodes: int | str = 1,
    returncode: int | None = None,
    memory: MemoryUse | None = None,
) -> tuple[int | None, str, str]:
    """Why a torchrun job failed: (rank or None, one line naming the cause, the details).

    Read in this order: the error.json that ``@record`` wrote; the failing rank's stderr.log
    (a traceback, or a script that never compiled: ``SyntaxError`` has no "Traceback" header);
    a signal in the failing rank's entry of torchrun's summary (a negative exit code is a
    signal; the SIGTERM torchrun then sends the other ranks is not a cause); torchrun's own
    exception (a rendezvous or store error: no worker ran) or its refusal of its arguments.
    """
    recorded = recorded_failures(out_dir / "torchrun_logs")
    if recorded:
        first = recorded[0]
        # error.json knows the local rank; on one node that is the rank, across nodes the
        # summary's "rank: N (local_rank: L)" maps it
        ranks = {int(local): int(rank) for rank, local in _RANK_PAIR.findall(log)}
        single = str(nnodes) in ("1", "1:1")
        rank = ranks.get(first.local_rank, first.local_rank if single else None)
        return rank, _failed(rank, first.message), first.traceback
    match = _ROOT_CAUSE.search(log)
    rank, local = (int(match.group(1)), match.group(2)) if match else (None, "*")
    logs = sorted(
        out_dir.glob(f"torchrun_logs/*/attempt_*/{local}/stderr.log"),
        key=lambda p: p.stat().st_mtime,
    )
    for path in reversed(logs):
        text = _TORCH_TAG.sub("", path.read_text(errors="replace")).strip()
        if "Traceback" in text:
            tb = text[text.rindex("Traceback") :]
            return rank, _failed(rank, _last_error(tb) or tb.splitlines()[-1]), tb
        error, where = _last_error(text), _FILE_LINE.search(text)
        if error and where:  # a compile error: File "x.py", line N / SyntaxError: ...
            tb = text[text.rfind("\n", 0, where.start()) + 1 :]  # from the File line
            place = _("{file}, line {line}").format(file=Path(where[1]).name, line=where[2])
            return rank, _failed(rank, f"{error} ({place})"), tb.strip()
    # the failing rank's own record: the root cause's entry of torchrun's summary, up to the
    # next rule; a signal named elsewhere (the SIGTERM the agent sent the other ranks after
    # the first one failed) is not its cause
    summary = _own_entry(log[match.start() :]) if match else log
    code = _EXITCODE.search(summary)
    signal_seen = _SIGNAL.search(summary)
    signum = -int(code[1]) if code and int(code[1]) < 0 else None
    if signum is None and signal_seen:
        signum = int(signal_seen[1])
    if signum is None and returncode is not None and returncode < 0:
        signum = -returncode
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = "?"
        who = _("rank {rank}").format(rank=rank) if rank is not None else "torchrun"
        line = _("{who} was killed by signal {num} ({name})").format(who=who, num=signum, name=name)
        pid = _PID.search(summary) if match else None
        oom = memory.out_of_memory(pid and int(pid[1])) if memory and signum == 9 else None
        if oom:  # the OOM killer's SIGKILL, as far as the figures tell
            line += ", " + oom
        return rank, line, _("(no Python traceback: a signal ended the process)")
    agent = _agent_error(log)
    if agent:
        line = _("torchrun itself failed: {error}").format(error=agent)
        if re.search(r"Rendezvous|[Ss]tore", agent):  # no worker ran: no job was formed
            line += " " + _("(its rendezvous store closed or could not be reached)")
        return None, line, log.strip()[-3000:]
    usage = _USAGE.findall(log)
    if usage:
        return (
            None,
            _("torchrun refused its arguments: {error}").format(error=usage[-1]),
            log.strip()[-3000:],
        )
    if match:
        line = _(
            "rank {rank} exited with exit code {code} without a Python error (sys.exit or "
            "os._exit?)"
        ).format(rank=rank, code=code[1] if code else "?")
        return rank, line, _("(no Python traceback: see the rank's stderr.log)")
    return None, _("torchrun failed without naming a cause; see the log"), log.strip()[-3000:]


def _own_entry(summary: str) -> str:
    """The root cause's entry, from its "Root Cause" line to the rule that closes it."""
    rule = re.search(r"^\s*(?:={20,}|-{20,})\s*$", summary, re.M)
    return summary[: rule.start()] if rule else summary


def _failed(rank: int | None, error: str) -> str:
    who = _("rank {rank}").format(rank=rank) if rank is not None else _("a worker")
    return _("{who} failed: {error}").format(who=who, error=error)


def torchrun(
    script: str | Path, args: list[str] | tuple = (), *, timeout: float = 600, **options: Any
) -> LaunchResult:
    """Run ``script`` under torchrun, stream its output, and return what the ranks wrote.

    ``options`` are those of :class:`Job` (nproc, device, out_dir, port, nnodes,
    rdzv_endpoint, max_restarts, env, torchrun_args, max_lines, prefix, view).
    """
    check_timeout(timeout)
    return Job(script, args, **options).wait(timeout)


def _default_view(job: Job) -> Any:
    from helpers import live  # imports ipywidgets only when a job starts

    where = f"{job.nproc} x {job.device}"
    return live.view_for(f"torchrun {job.script.name} ({where})", job.request_stop)


def _stop_all() -> None:
    for job in list(_LIVE):
        job.stop()


atexit.register(_stop_all)
