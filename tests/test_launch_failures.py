"""Why a torchrun job failed, said in the error's first line; arguments refused before start.

Unit tests feed ``read_cause`` log folders shaped like torchrun's; the job tests launch for real
a script that never compiled, torchrun given a bad argument, and two jobs on one port at once.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from pathlib import Path

import pytest

from helpers import env, launch, procs

SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
job.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_04:40:01
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 28305)
  error_file: <N/A>
  traceback : {traceback}
============================================================"""

SYNTAX = 'File "/tmp/job.py", line 3\n    def f(:\n          ^\nSyntaxError: invalid syntax\n'


def job_folder(tmp_path: Path, stderr: dict[int, str]) -> Path:
    """An out_dir as torchrun leaves it: one stderr.log per local rank of attempt 0."""
    for local, text in stderr.items():
        folder = tmp_path / "torchrun_logs" / "run-id" / "attempt_0" / str(local)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    return tmp_path


def test_a_script_that_never_compiled_is_named_not_called_killed(tmp_path):
    out = job_folder(tmp_path, {0: "", 1: "  " + SYNTAX})
    log = SUMMARY.format(rank=1, code=1, traceback="To enable traceback see: ...")
    rank, cause, detail = launch.read_cause(out, log, 1, 1)
    assert (rank, cause) == (1, "rank 1 failed: SyntaxError: invalid syntax (job.py, line 3)")
    assert detail.startswith('File "/tmp/job.py", line 3') and "killed" not in cause


@pytest.mark.parametrize("tag", ["", "[rank0]: "])  # torch's tag once a group exists
def test_a_traceback_names_its_last_error_line(tmp_path, tag):
    tb = "Traceback (most recent call last):\n  File ...\nValueError: bad batch\n"
    text = "Exception raised from x\n" + tb
    out = job_folder(tmp_path, {0: "".join(tag + ln for ln in text.splitlines(keepends=True))})
    rank, cause, detail = launch.read_cause(out, SUMMARY.format(rank=0, code=1, traceback=""))
    assert (rank, cause) == (0, "rank 0 failed: ValueError: bad batch")
    assert detail.startswith("Traceback")


@pytest.mark.parametrize(
    ("code", "traceback", "said"),
    [
        ("-9", "", "rank 1 was killed by signal 9 (SIGKILL)"),
        ("1", "Signal 15 (SIGTERM) received by PID 123", "rank 1 was killed by signal 15"),
        ("3", "", "rank 1 exited with exit code 3 without a Python error"),
    ],
)
def test_killed_only_when_a_signal_says_so(tmp_path, code, traceback, said):
    out = job_folder(tmp_path, {1: "some warning\n"})
    log = SUMMARY.format(rank=1, code=code, traceback=traceback)
    rank, cause, _ = launch.read_cause(out, log, 1, 1)
    assert rank == 1 and cause.startswith(said)
    assert ("killed" in cause) == (code != "3")


# torchrun's summary after rank 1 called sys.exit(3): the agent then sent SIGTERM to rank 0,
# whose record (a failure, but not the first) says so (torch 2.14.1, 2026-12-03)
PEER_STOPPED = """\
E1203 10:15:11.046000 4099 api.py:1002] failed (exitcode: 3) local_rank: 1 (pid: 4112) of binary
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/tmp/exit3.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_10:15:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4111)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4111
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_10:15:10
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 4112)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def test_the_signal_torchrun_sent_a_peer_is_not_the_failing_ranks_cause(tmp_path):
    """Issue 47, case 1: the root cause's own record (exit code 3) wins over a peer's SIGTERM."""
    out = job_folder(tmp_path, {0: "[rank0]: RuntimeError: Connection closed by peer\n", 1: ""})
    rank, cause, _ = launch.read_cause(out, PEER_STOPPED, 1, 1)
    assert (rank, cause) == (
        1,
        "rank 1 exited with exit code 3 without a Python error (sys.exit or os._exit?)",
    )


RENDEZVOUS = """\
[W1202 04:41:20.749568027 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl: Broken pipe
Exception raised from sendBytes at /__w/pytorch/torch/csrc/distributed/c10d/Utils.hpp:761
W1202 04:41:20.999000 29406 dynamic_rendezvous.py:1298] The node has failed to shutdown
Traceback (most recent call last):
  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 117, in _call_store
torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "torch/distributed/run.py", line 1142, in <module>
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d \
store has failed. See inner exception for details."""


def test_an_agent_whose_rendezvous_store_closed_says_so(tmp_path):
    """Seen when a second agent joined another job's rendezvous on the same port."""
    rank, cause, _ = launch.read_cause(job_folder(tmp_path, {}), RENDEZVOUS, 1, 1)
    assert rank is None
    assert cause.startswith(
        "torchrun itself failed: torch.distributed.elastic.rendezvous.api."
        "RendezvousConnectionError: The connection to the C10d store has failed."
    )
    assert cause.endswith("(its rendezvous store closed or could not be reached)")


def test_torchrun_refusing_its_arguments_says_which(tmp_path):
    log = "usage: run.py [-h] [--nnodes NNODES]\nrun.py: error: unrecognized arguments: --bogus"
    _, cause, _ = launch.read_cause(job_folder(tmp_path, {}), log, 1, 2)
    assert cause == "torchrun refused its arguments: unrecognized arguments: --bogus"


def test_a_rank_tag_is_shown_once():
    """torch's excepthook already tags a worker's traceback with its (global) rank."""
    assert launch.rank_tagged("[default1]:[rank1]: Traceback") == "[rank1] Traceback"
    assert launch.rank_tagged("[default0]:[rank4]:x") == "[rank4] x"
    assert launch.rank_tagged("[default1]:step 3") == "[rank1] step 3"
    assert launch.rank_tagged("agent line") == "agent line"


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("nproc", "2", "nproc must be a whole number, at least 1, got '2'; pass e.g. nproc=2."),
        ("nproc", True, "nproc must be a whole number, at least 1, got True"),
        ("nproc", 1.5, "nproc must be a whole number"),
        ("nnodes", 0, "nnodes must be a whole number, at least 1, got 0"),
        ("nnodes", "two", "nnodes must be a whole number"),
        ("max_restarts", -1, "max_restarts must be a whole number, at least 0, got -1"),
        ("max_restarts", False, "max_restarts must be a whole number"),
        ("port", "29500", "port must be a whole number, at least 1, got '29500'"),
        ("port", 70000, "port must be at most 65535, got 70000"),
        ("max_lines", None, "max_lines must be a whole number"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, option, value, said):
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    with pytest.raises(launch.LaunchError) as info:
        launch.Job(script, device="cpu", **{"nproc": 1, option: value})
    assert str(info.value).startswith(said)


@pytest.mark.parametrize("timeout", [0, -5, True, "60", None])
def test_a_bad_timeout_is_refused_before_anything_starts(tmp_path, timeout):
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    with pytest.raises(launch.LaunchError, match="timeout must be a number of seconds above 0"):
        launch.torchrun(script, timeout=timeout, nproc=1, device="cpu")


def test_an_explicit_port_is_locked_for_one_launch():
    port = env.free_port()
    first = launch.PortLock(port)
    try:
        with pytest.raises(launch.PortInUse) as info:
            launch.PortLock(port)
        assert str(info.value) == (
            f"Port {port} is in use by another launch (pid {os.getpid()}); pass port=None "
            "to pick a free one."
        )
    finally:
        first.release()
    launch.PortLock(port).release()  # free again once released


# ---------------------------------------------------------------- real launches


def test_a_syntax_error_script_launched_for_real(tmp_path, no_orphans):
    script = tmp_path / "broken.py"
    script.write_text("import os\n\ndef main(:\n    pass\n")
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=1, device="cpu", timeout=120, out_dir=tmp_path / "out")
    first = str(info.value).splitlines()[0]
    assert first.startswith("torchrun exited with code 1: rank 0 failed: SyntaxError:")
    assert first.endswith("(broken.py, line 3)") and "killed" not in str(info.value)


def test_a_bad_torchrun_argument_launched_for_real(tmp_path, no_orphans):
    script = tmp_path / "fine.py"
    script.write_text("pass\n")
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=1, device="cpu", timeout=120, torchrun_args=["--bogus"])
    first = str(info.value).splitlines()[0]
    assert first == "torchrun exited with code 2: torchrun refused its arguments: " + (
        "unrecognized arguments: --bogus"
    )


def test_two_launches_on_one_port_at_once(tmp_path, no_orphans):
    """Both see the port free in the same instant; one runs, the other is told why not."""
    script = tmp_path / "fine.py"
    script.write_text("from helpers.launch import write_rank_output\nwrite_rank_output({})\n")
    port, start = env.free_port(), threading.Barrier(2)
    outcomes: list[object] = []

    def launch_one(name: str) -> None:
        start.wait()
        try:
            outcomes.append(
                launch.torchrun(
                    script, nproc=1, device="cpu", port=port, timeout=120, out_dir=tmp_path / name
                )
            )
        except launch.LaunchError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=launch_one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    errors = [o for o in outcomes if isinstance(o, launch.LaunchError)]
    results = [o for o in outcomes if isinstance(o, launch.LaunchResult)]
    assert len(results) == 1 and results[0].returncode == 0
    assert len(errors) == 1 and isinstance(errors[0], launch.PortInUse)
    assert str(errors[0]).splitlines()[0] == (
        f"Port {port} is in use by another launch (pid {os.getpid()}); pass port=None to "
        "pick a free one."
    )
    assert env.port_is_free(port)
    launch.PortLock(port).release()  # and its lock was released with the job


GROUP_CRASH = """\
import torch.distributed as dist

dist.init_process_group("gloo")  # from here torch's excepthook tags tracebacks "[rankN]:"
if dist.get_rank() == 1:
    raise ValueError("rank 1 failed inside the group on purpose")
dist.destroy_process_group()
"""


def test_a_traceback_inside_a_group_shows_one_rank_tag(tmp_path, no_orphans, capsys):
    script = tmp_path / "group.py"
    script.write_text(GROUP_CRASH)
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=2, device="cpu", timeout=120)
    shown = capsys.readouterr().out
    assert "[rank1] Traceback" in shown and "[rank1] [rank1]" not in shown
    assert str(info.value).splitlines()[0] == (
        "torchrun exited with code 1: rank 1 failed: ValueError: rank 1 failed inside the group "
        "on purpose"
    )


EXIT_3 = """\
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    sys.exit(3)  # no Python error: torchrun records exit code 3, then stops rank 0 with SIGTERM
dist.barrier()
dist.destroy_process_group()
"""


def test_a_rank_that_exits_with_a_code_is_not_called_killed(tmp_path, no_orphans):
    """Issue 47, case 1, launched for real: rank 0's SIGTERM came from torchrun afterwards."""
    script = tmp_path / "exit3.py"
    script.write_text(EXIT_3)
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=2, device="cpu", timeout=120, out_dir=tmp_path / "out")
    assert info.value.rank == 1
    assert str(info.value).splitlines()[0] == (
        "torchrun exited with code 1: rank 1 exited with exit code 3 without a Python error "
        "(sys.exit or os._exit?)"
    )


STOPPED_WHILE_WRITING = """\
import os
import time
from pathlib import Path

from helpers.launch import write_rank_output

error_file = Path(os.environ["TORCHELASTIC_ERROR_FILE"])  # .../attempt_N/<local rank>/error.json
restarts = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restarts == 0 and os.environ["RANK"] == "0":
    with open(error_file, "w"):  # what @record opens when a collective failed: empty so far
        time.sleep(600)  # the agent's SIGTERM comes first, the file stays empty
if restarts == 0:  # rank 1 dies once rank 0 is inside its error file
    while not (error_file.parent.parent / "0" / "error.json").exists():
        time.sleep(0.05)
    os._exit(1)
write_rank_output({"restarts": restarts})
"""


def test_a_rank_stopped_while_writing_its_error_file_still_gets_restarted(tmp_path, no_orphans):
    """torch 2.14's agent fails on the empty file; helpers.torchrun sets it aside."""
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_WHILE_WRITING)
    result = launch.torchrun(
        script, nproc=2, device="cpu", timeout=120, max_restarts=1, out_dir=tmp_path / "out"
    )
    assert [result.rank(r)["restarts"] for r in (0, 1)] == [1, 1]
    set_aside = list((tmp_path / "out").glob("torchrun_logs/*/attempt_0/0/error.json.half-written"))
    assert len(set_aside) == 1 and "stopped while writing its error file" in result.log


def test_a_launch_that_loses_the_race_by_a_moment_still_names_the_holder():
    """The holder writes its pid just after taking the lock: the loser waits for it."""
    port = env.free_port()
    path = Path(tempfile.gettempdir()) / f"multigpu-lab-port-{port}.lock"
    with open(path, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # locked, pid not written yet
        writer = threading.Timer(0.2, lambda: (holder.write("4242"), holder.flush()))
        writer.start()
        with pytest.raises(launch.PortInUse, match=r"\(pid 4242\)"):
            launch.PortLock(port)
        writer.join()


def test_a_sigkill_after_memory_ran_out_says_so(tmp_path):
    """Issue 47, case 2: the OOM killer's SIGKILL was reported with no word of memory."""
    out = job_folder(tmp_path, {1: ""})
    log = SUMMARY.format(rank=1, code=-9, traceback="Signal 9 (SIGKILL) received by PID 28305")
    memory = launch.MemoryUse(available_at_start=12 * 2**30, total=16 * 2**30)
    memory.peaks = {28305: 11 * 2**30, 28304: 2**29}
    memory.peak_job, memory.least_available = 11.5 * 2**30, 200 * 2**20
    _, cause, _ = launch.read_cause(out, log, 1, 1, memory=memory)
    assert cause == (
        "rank 1 was killed by signal 9 (SIGKILL), probably out of memory: it peaked at 11.0 GiB "
        "and the job at 11.5 GiB, with 12.0 GiB of 16.0 GiB available when it started"
    )
    calm = launch.MemoryUse(available_at_start=12 * 2**30, total=16 * 2**30)
    calm.peaks, calm.peak_job, calm.least_available = {28305: 2**28}, 2**29, 11 * 2**30
    calm.oom_kills_at_start = None  # where the kernel does not count them
    _, cause, _ = launch.read_cause(out, log, 1, 1, memory=calm)  # a kill -9 from a person
    assert cause == "rank 1 was killed by signal 9 (SIGKILL)"
    if procs.oom_kills() is not None:  # a sudden allocation, between two samples
        calm.oom_kills_at_start = procs.oom_kills() - 1
        _, cause, _ = launch.read_cause(out, log, 1, 1, memory=calm)
        assert cause.startswith("rank 1 was killed by signal 9 (SIGKILL), probably out of ")
        assert cause.endswith("; the kernel's OOM killer ended a process meanwhile")


ALLOCATE_THEN_KILLED = """\
import os
import signal
import time

ballast = b"x" * (300 * 2**20)  # written, so resident
time.sleep(3)  # the launcher samples the tree meanwhile
os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
"""


def test_a_rank_killed_at_its_memory_peak_is_reported_out_of_memory(
    tmp_path, monkeypatch, no_orphans
):
    """Launched for real: 300 MiB resident where 400 MiB were available (the machine's figures
    stand in, so that the test never pushes a shared machine out of memory)."""
    monkeypatch.setattr(launch, "machine_memory", lambda: (400 * 2**20, 24 * 2**30), raising=False)
    script = tmp_path / "ballast.py"
    script.write_text(ALLOCATE_THEN_KILLED)
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=1, device="cpu", timeout=120, out_dir=tmp_path / "out")
    first = str(info.value).splitlines()[0]
    assert first.startswith(
        "torchrun exited with code 1: rank 0 was killed by signal 9 (SIGKILL), probably out of "
        "memory: it peaked at 3"
    ), first
    assert first.endswith("with 400 MiB of 24.0 GiB available when it started"), first


GROWS = """\
import time

held = []
for _ in range(100):  # 5 GiB in 50 MiB steps: the cgroup's limit ends it long before
    held.append(b"x" * (50 * 2**20))
    time.sleep(0.1)
"""


@pytest.fixture
def memory_cgroup(tmp_path):
    """A memory cgroup of 1.2 GiB (v1 or v2) for one job, so that the kernel's real OOM killer
    ends a rank without the machine running short; skipped where cgroups cannot be made."""
    limit = str(1200 * 2**20)
    for root, limit_file in (
        (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
        (Path("/sys/fs/cgroup"), "memory.max"),
    ):
        group = root / f"multigpu-lab-test-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / limit_file).write_text(limit)
        except OSError:
            group.rmdir()
            continue
        join = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        try:
            yield ["sh", "-c", join, "sh"]
        finally:
            group.rmdir()  # empty by now: the launcher left nothing running
        return
    pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")


def test_a_rank_the_oom_killer_ended_is_reported_out_of_memory(tmp_path, memory_cgroup, no_orphans):
    """Issue 47, case 2, with the kernel's own OOM killer (in a cgroup, not the machine)."""
    script = tmp_path / "grows.py"
    script.write_text(GROWS)
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(
            script,
            nproc=1,
            device="cpu",
            timeout=120,
            out_dir=tmp_path / "out",
            prefix=memory_cgroup,
        )
    first = str(info.value).splitlines()[0]
    assert first.startswith(
        "torchrun exited with code 1: rank 0 was killed by signal 9 (SIGKILL), probably out of "
        "memory: it peaked at "
    ), first
    assert first.endswith("; the kernel's OOM killer ended a process meanwhile"), first
