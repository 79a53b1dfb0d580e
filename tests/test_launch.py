"""The torchrun launcher: success, crash, timeout, busy port, too many processes, interrupt.

Every case also checks that nothing was left running and that the port was freed.
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers import env, launch
from helpers.procs import is_alive
from labtools import ledger

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from helpers.launch import write_rank_output

    rank = int(os.environ["RANK"])
    mode = sys.argv[1]
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} starting", flush=True)
    if mode == "crash" and rank == 1:
        raise ZeroDivisionError("rank 1 divided by zero on purpose")
    if mode == "hang":
        time.sleep(600)
    if mode == "chatty":
        for i in range(500):
            print(f"line {i}")
    write_rank_output({"rank": rank, "port": os.environ["MASTER_PORT"],
                       "omp": os.environ["OMP_NUM_THREADS"]})
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_success_returns_each_ranks_output(script, tmp_path, no_orphans, capsys):
    result = launch.torchrun(script, ["ok"], nproc=2, device="cpu", out_dir=tmp_path / "out")
    assert result.returncode == 0
    assert sorted(result.outputs) == [0, 1]
    assert result.rank(1)["rank"] == 1
    shown = capsys.readouterr().out
    assert "[rank0] rank 0 of 2 starting" in shown and "[rank1] rank 1 of 2 starting" in shown
    first = shown.splitlines()[0]  # the line a learner types: plain torchrun, no kit flags
    assert first == f"$ torchrun --nproc-per-node=2 --standalone {script} ok", first
    assert env.port_is_free(int(result.rank(0)["port"]))
    assert (tmp_path / "out" / "torchrun.log").exists()
    share = os.environ.get("OMP_NUM_THREADS") or str(launch.threads_per_rank(2))
    assert result.rank(0)["omp"] == result.rank(1)["omp"] == share  # the cores, shared out
    [job] = ledger.read(tmp_path)  # the job's own record, in its folder, read from outside
    assert job == {
        "script": "job.py",
        "nproc": 2,
        "nnodes": "1",
        "started": pytest.approx(time.time() - result.seconds, abs=5.0),
        "seconds": pytest.approx(result.seconds, abs=1.0),
        "status": "finished",
        "progress_ranks": [],  # this script prints no progress line
    }


def test_the_echoed_command_is_the_torchrun_line_a_learner_types(tmp_path):
    """Issue 44: the kit's wrapper and its log flags stay out of sight; what matters stays."""
    opts = {
        "log_dir": tmp_path / "logs",
        "max_restarts": 3,
        "rdzv_endpoint": None,
        "nnodes": 1,
        "rdzv_id": "x",
        "port": None,
        "torchrun_args": [],
    }
    argv = launch._torchrun_argv(tmp_path / "work" / "ddp.py", ["--epochs", "1"], 2, opts)
    shown = launch.command_line(["ip", "netns", "exec", "h1", *argv], {"A": "1 2"}, tmp_path)
    assert shown == (
        "A='1 2' ip netns exec h1 torchrun --nproc-per-node=2 --max-restarts=3 --standalone "
        "work/ddp.py --epochs 1"
    )


def test_threads_per_rank_shares_the_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert [launch.threads_per_rank(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_crashing_rank_raises_with_its_traceback(script, no_orphans):
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, ["crash"], nproc=2, device="cpu")
    assert info.value.rank == 1
    assert "ZeroDivisionError: rank 1 divided by zero on purpose" in str(info.value)
    assert "Traceback" in info.value.traceback


RECORDED = textwrap.dedent(
    """
    import os
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            raise ValueError("rank 1 read a bad batch on purpose")

    if __name__ == "__main__":
        main()
    """
)


def test_recorded_crash_is_named_from_its_error_json(tmp_path, no_orphans):
    script = tmp_path / "recorded.py"
    script.write_text(RECORDED)
    with pytest.raises(launch.WorkerFailed) as info:
        launch.torchrun(script, nproc=2, device="cpu", out_dir=tmp_path / "out")
    (failure,) = launch.recorded_failures(tmp_path / "out" / "torchrun_logs")
    assert (failure.local_rank, failure.message) == (
        1,
        "ValueError: rank 1 read a bad batch on purpose",
    )
    assert info.value.rank == 1
    assert info.value.traceback == failure.traceback
    assert failure.traceback.startswith("Traceback") and "in main" in failure.traceback


def write_error_json(folder: Path, local_rank: int, written_ns: int, message: str) -> None:
    """An error.json as @record writes it, in torch's format, written at ``written_ns``."""
    (folder / str(local_rank)).mkdir(parents=True)
    path = folder / str(local_rank) / "error.json"
    extra = {"py_callstack": f"Traceback ...\n{message}", "timestamp": "1764590000"}  # one second
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))
    os.utime(path, ns=(written_ns, written_ns))


def test_recorded_failures_take_the_last_attempt_first_written_first(tmp_path):
    """Both files say the same second, as they often do; the one written first is the cause."""
    run = tmp_path / "logs" / "run-id"
    second = 1_764_590_000 * 10**9
    write_error_json(run / "attempt_0", 0, second, "ValueError: recovered by the restart")
    write_error_json(run / "attempt_1", 0, second + 4_000_000, "RuntimeError: Connection closed")
    write_error_json(run / "attempt_1", 1, second + 3_000_000, "ValueError: the root cause")
    (run / "attempt_1" / "2").mkdir()
    (run / "attempt_1" / "2" / "error.json").write_text('{"message": ')  # half-written
    failures = launch.recorded_failures(tmp_path / "logs")
    assert [(f.local_rank, f.message) for f in failures] == [
        (1, "ValueError: the root cause"),
        (0, "RuntimeError: Connection closed"),
    ]
    assert launch.recorded_failures(tmp_path / "nothing") == []


def test_timeout_kills_every_worker(script, no_orphans, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a job without out_dir keeps its logs in the working folder
    job = launch.Job(script, ["hang"], nproc=2, device="cpu")
    deadline = time.monotonic() + 60
    while len(job.worker_pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = job.worker_pids()
    assert len(workers) >= 2
    start = time.monotonic()
    with pytest.raises(launch.LaunchTimeout, match="ran past its 5 s limit"):
        job.wait(timeout=5)
    assert time.monotonic() - start < 20
    assert not any(is_alive(p) for p in workers + [job.proc.pid])
    job.stop()  # a second close (a cell's ``with`` block) does not count the job twice
    assert job.out_dir.parent == tmp_path / "work" / "launch"
    assert [j["status"] for j in ledger.read(tmp_path)] == ["timed out (5 s limit)"]


def test_busy_port_is_refused_before_start_and_freed_after(script, no_orphans):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(launch.PortInUse, match=f"Port {port} is already in use"):
            launch.torchrun(script, ["ok"], nproc=2, device="cpu", port=port)
    result = launch.torchrun(script, ["ok"], nproc=2, device="cpu", port=port)
    assert result.returncode == 0
    assert env.port_is_free(port)


def test_too_many_processes_is_refused_before_start(script, no_orphans):
    with pytest.raises(launch.TooManyProcesses, match="cores"):
        launch.torchrun(script, ["ok"], nproc=1000, device="cpu")
    gpus = env.gpu_info().count
    with pytest.raises(launch.TooManyProcesses, match=f"only {gpus} GPU"):
        launch.torchrun(script, ["ok"], nproc=gpus + 1, device="cuda")
    with pytest.raises(launch.TooManyProcesses, match="at least 1, got 0"):
        launch.torchrun(script, ["ok"], nproc=0, device="cpu")  # an error, never "the default"


def test_missing_script_says_which_cell_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="%%writefile"):
        launch.torchrun(tmp_path / "nope.py")


def test_kernel_interrupt_stops_the_group(script, no_orphans):
    # A kernel turns SIGINT into KeyboardInterrupt; a CI shell may start us with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        job = launch.Job(script, ["hang"], nproc=2, device="cpu")
        threading.Timer(6.0, _thread.interrupt_main).start()
        with pytest.raises(KeyboardInterrupt):
            job.wait(timeout=120)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not is_alive(job.proc.pid)
    assert job.worker_pids() == []


def test_output_is_capped_not_flooded(script, capsys, no_orphans):
    result = launch.torchrun(script, ["chatty"], nproc=2, device="cpu", max_lines=50)
    shown = capsys.readouterr().out
    assert len(shown.splitlines()) <= 52
    assert "more output is in" in shown
    assert result.log.count("line 499") == 2  # the full log keeps everything


def test_a_line_torchrun_copied_in_halves_is_joined_again():
    """--tee copies a half-written worker line, then the rest with the prefix again (seen in CI:
    a progress line printed as log because of it)."""
    glued = "[default1]:progress: step 45/63, loss 0.42[default1]:"
    assert launch.unglue(glued) == ["[default1]:progress: step 45/63, loss 0.42"]
    between = "[default1]:prog[default0]:[rank0] done[default1]:ress: step 1/2"
    assert launch.unglue(between) == ["[default1]:progress: step 1/2", "[default0]:[rank0] done"]
    assert launch.unglue("agent line [default0]:x") == ["agent line ", "[default0]:x"]
    assert launch.unglue("[default0]:one line") == ["[default0]:one line"]


# torchrun's agent as a learner runs the printed command, watched: when it starts importing torch
# (seconds, the first time), it says so and waits for the test's Ctrl-C before the import goes on
IMPORT_WATCHED = """\
import runpy
import sys


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            print("importing torch", flush=True)
            sys.stdin.readline()  # the Ctrl-C arrives here, inside the first import of torch
        return None


sys.meta_path.insert(0, Watch())
sys.argv = ["helpers.torchrun", *sys.argv[1:]]
runpy.run_module("helpers.torchrun", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_the_agent_imports_torch_is_kept(tmp_path, no_orphans):
    """Issue 47, case 6: the interrupt handling is in place before torch's first import."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text("from pathlib import Path\n\nPath('ran').write_text('')\n")
    agent = subprocess.Popen(
        [sys.executable, "-c", IMPORT_WATCHED, "--nproc-per-node=1", "--standalone", str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert agent.stdout.readline() == "importing torch\n"
        agent.send_signal(signal.SIGINT)
        _, err = agent.communicate("\n", timeout=120)  # the import goes on
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and not (tmp_path / "ran").exists()
    assert err.splitlines()[-1] == (
        "helpers.torchrun: interrupted (Ctrl-C) while it imported torch; nothing was started."
    )
