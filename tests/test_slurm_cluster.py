"""The Slurm template run for real: a two-node cluster on this machine (the ``slurm`` lane).

``cluster/slurm/localcluster.py`` brings up a controller and two compute nodes (each in its own
network namespace), the tests submit ``cluster/slurm/train.sbatch.template`` in its CPU form with
``sbatch`` and watch it with ``helpers.slurm`` (what notebook 14 does when ``sinfo`` answers):
notebook 02's DDP trained across both nodes, ``scancel`` mid-run, a node lost mid-job and the
requeued job resuming from its checkpoint, a job larger than the cluster, and ``down`` leaving
nothing. Needs root and Debian's slurm-wlm and munge (installed with apt when missing); elsewhere
the lane is skipped with the reason. The module's fixture takes the cluster down even when a test
fails. The first tests need no cluster: why the tool refuses.
"""

from __future__ import annotations

import importlib.util
import json
import re
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import slurm

STEM = "14_multi_node"  # its tests' group (tests/conftest.py): never beside notebook 14's run
REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "cluster" / "slurm" / "train.sbatch.template"
SHARED_DATA = REPO.parent / "shared" / "data"

_spec = importlib.util.spec_from_file_location(
    "localcluster", REPO / "cluster/slurm/localcluster.py"
)
localcluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(localcluster)


# ------------------------------------------------------------------ refusals (no cluster needed)


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(localcluster.os, "geteuid", lambda: 1000)
    assert "needs root" in localcluster.refusal()


def test_refuses_beside_a_configured_slurm(monkeypatch, tmp_path):
    system = tmp_path / "slurm.conf"
    system.write_text("ClusterName=site\n")
    monkeypatch.setattr(localcluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(localcluster, "SYSTEM_CONFS", (system,))
    assert f"already configured here ({system})" in localcluster.refusal()


def test_refuses_without_slurm_and_without_apt(monkeypatch):
    monkeypatch.setattr(localcluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(localcluster, "SYSTEM_CONFS", ())
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(localcluster.shutil, "which", lambda name: None)
    reason = localcluster.refusal()
    assert "no apt-get" in reason and "slurmctld" in reason


def test_the_cli_says_why_and_exits_non_zero(monkeypatch, capsys):
    monkeypatch.setattr(localcluster.os, "geteuid", lambda: 1000)
    assert localcluster.main(["up"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_no_cluster_without_sinfo(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    assert slurm.find() is None


def test_the_config_keeps_everything_under_the_kit_folder():
    conf = localcluster.slurm_conf()
    paths = re.findall(r"=(/\S+)", conf)
    assert paths and all(p.startswith(str(localcluster.KIT)) for p in paths), paths
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    assert int(re.search(r"SlurmdTimeout=(\d+)", conf)[1]) <= 10  # a lost node in seconds


# ------------------------------------------------------------------ the lane


def lane(test):
    """A test of the slurm lane: it starts processes (``job``), so ``make unit`` leaves it out."""
    return pytest.mark.slurm(pytest.mark.job(test))


def skip_reason() -> str | None:
    reason = localcluster.refusal()
    if reason:
        return reason
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        return "this container cannot make network namespaces (unshare --net)"
    return None


TIMINGS: dict[str, float] = {}  # seconds of each step, printed at the end of the lane


@pytest.fixture(scope="module")
def cluster():
    """The local cluster, up for this module's tests and always down after them."""
    reason = skip_reason()
    if reason:
        pytest.skip(f"no local Slurm cluster: {reason}")
    start = time.monotonic()
    try:
        localcluster.install()  # Debian's slurm-wlm and munge, when missing
    except localcluster.Refused as exc:
        pytest.skip(f"no local Slurm cluster: {exc}")
    TIMINGS["install"] = time.monotonic() - start
    start = time.monotonic()
    try:
        localcluster.up()
        TIMINGS["up"] = time.monotonic() - start
        found = slurm.find()
        assert found is not None and found.local, "sinfo did not answer after up"
        yield found
    finally:
        localcluster.down()
        print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def cpu_values(tmp_path: Path, cluster: slurm.Cluster, name: str) -> dict[str, object]:
    """The template's CPU form on the local cluster: no GPU request, one worker per node."""
    data = SHARED_DATA if (SHARED_DATA / "MNIST").is_dir() else tmp_path / "data"
    return {
        "JOB_NAME": name,
        "NODES": 2,
        "WORKERS_PER_NODE": 1,
        "GRES": "none",
        "CPUS_PER_TASK": cluster.cpus_per_node,
        "TIME_LIMIT": "00:15:00",
        "PORT": 29500,
        "NET_IFNAME": "eth0",
        "MAX_RESTARTS": 1,
        "EPOCHS": 1,
        "CHECKPOINT_EVERY": 20,
        "REPO": REPO,
        "PYTHON": sys.executable,
        "DATA_DIR": data,
        "SHARED_DIR": tmp_path / "shared",
    }


def submit(tmp_path: Path, cluster: slurm.Cluster, name: str, *options: str) -> str:
    script = tmp_path / f"{name}.sbatch"
    values = cpu_values(tmp_path, cluster, name)
    script.write_text(string.Template(TEMPLATE.read_text()).safe_substitute(values))
    out = subprocess.run(
        ["sbatch", "--parsable", *options, script.name],
        cwd=tmp_path,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def wait_for(what, timeout: float = 300, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"gave up waiting after {timeout:.0f} s"
        time.sleep(every)
    return found


def ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))}


def job_processes() -> dict[str, list[int]]:
    """What runs on each node beyond its slurmd and the namespace's holder."""
    keep = {pid for pids in localcluster.daemons().values() for pid in pids}
    keep |= set(localcluster.holders().values())
    return {n: [p for p in localcluster.on_node(n) if p not in keep] for n in localcluster.NODES}


@lane
def test_up_is_idempotent_and_sinfo_shows_two_idle_nodes(cluster):
    before = localcluster.daemons()
    start = time.monotonic()
    localcluster.up()
    TIMINGS["up again"] = time.monotonic() - start
    assert localcluster.daemons() == before  # nothing started twice
    nodes = slurm.find().nodes
    print("sinfo:", nodes)
    assert [(n["name"], n["state"]) for n in nodes] == [("n1", "idle"), ("n2", "idle")]


# The lines that tell a job's story (the rest: progress lines, a killed agent's traceback).
STORY = r"head node|srun: error|slurmstepd|\d: resumed|\d: test accuracy|\d: progress: step 63/"
REFERENCE: dict[str, float] = {}  # the uninterrupted job's accuracy, for the lost-node test


@lane
def test_sbatch_trains_ddp_across_both_nodes(cluster, tmp_path):
    start = time.monotonic()
    job = submit(tmp_path, cluster, "mnist-ddp")
    end = slurm.follow(job, cluster.env, every=1)
    TIMINGS["submit -> complete"] = time.monotonic() - start
    log = (tmp_path / f"mnist-ddp-{job}.out").read_text()
    print("\n".join(ln for ln in log.splitlines() if re.match(STORY, ln)))
    assert end["JobState"] == "COMPLETED", (end, log[-3000:])
    assert "head node n1, rendezvous n1:29500, 2 nodes" in log
    assert re.search(r"^0: progress: step \d+/", log, re.M)  # srun --label: task 0 on n1
    assert re.search(r"^1: progress: step \d+/", log, re.M)  # ... and task 1 on n2
    out = ranks(tmp_path / "shared" / f"mnist-ddp-{job}")  # the shared folder
    print({f"rank {r}": (o["world_size"], o["accuracy"], o["steps"]) for r, o in out.items()})
    assert sorted(out) == [0, 1] and {o["world_size"] for o in out.values()} == {2}
    assert out[0]["accuracy"] == out[1]["accuracy"] > 0.5
    REFERENCE["accuracy"] = out[0]["accuracy"]
    REFERENCE["steps"] = out[0]["steps"]


@lane
def test_scancel_mid_run_leaves_no_process_on_either_node(cluster, tmp_path):
    job = submit(tmp_path, cluster, "mnist-cancel")
    log = tmp_path / f"mnist-cancel-{job}.out"
    wait_for(lambda: log.exists() and "progress: step" in log.read_text())
    running = job_processes()
    assert all(running.values()), running  # torchrun and its worker on both nodes
    start = time.monotonic()
    subprocess.run(["scancel", job], env=cluster.env, check=True, timeout=30)
    end = slurm.follow(job, cluster.env, every=0.5, timeout=120)
    wait_for(lambda: not any(job_processes().values()), timeout=60)
    TIMINGS["scancel -> nothing left"] = time.monotonic() - start
    assert end["JobState"] == "CANCELLED", end
    print(f"before scancel: {running}; after: {job_processes()}")


@lane
def test_a_lost_node_ends_the_step_and_the_requeued_job_resumes(cluster, tmp_path):
    if "accuracy" not in REFERENCE:
        pytest.skip("needs the uninterrupted job's accuracy (test_sbatch_trains_ddp...)")
    job = submit(tmp_path, cluster, "mnist-lost")
    log = tmp_path / f"mnist-lost-{job}.out"
    # The checkpoint of step 20 is saved before that step's progress line is printed.
    wait_for(lambda: log.exists() and "progress: step 20/" in log.read_text(), every=0.1)
    assert (tmp_path / "shared" / "mnist-lost.pt").exists()
    killed_at = time.monotonic()
    killed = localcluster.kill_node("n2")  # its slurmd, slurmstepd, torchrun and worker
    print(f"n2 unplugged: SIGKILL to {killed}")
    wait_for(lambda: "DUE TO NODE FAILURE" in log.read_text(), timeout=120, every=0.5)
    TIMINGS["node killed -> step ended (NODE_FAIL)"] = time.monotonic() - killed_at
    requeued = wait_for(lambda: slurm.job_fields(job, cluster.env).get("Restarts") == "1", 60)
    localcluster.up()  # the node comes back: its slurmd registers again
    end = slurm.follow(job, cluster.env, every=1)
    TIMINGS["node killed -> requeued job complete"] = time.monotonic() - killed_at
    text = log.read_text()
    print("\n".join(ln for ln in text.splitlines() if re.match(STORY, ln)))
    assert requeued and end["JobState"] == "COMPLETED" and end["Restarts"] == "1", end
    assert "srun: error: Node failure on n2" in text  # the step's end, named by Slurm
    assert "head node n1, rendezvous n1:29500, 2 nodes, start 1" in text  # appended, not lost
    assert re.search(r"^0: resumed from step [1-9]\d*", text, re.M)
    out = ranks(tmp_path / "shared" / f"mnist-lost-{job}")
    assert out[0]["resumed_from_step"] > 0 and out[0]["steps"] == REFERENCE["steps"]
    print(f"accuracy: uninterrupted {REFERENCE['accuracy']}, resumed {out[0]['accuracy']}")
    assert out[0]["accuracy"] == pytest.approx(REFERENCE["accuracy"], abs=0.005)


@lane
def test_more_nodes_than_exist_is_refused_with_slurms_reason(cluster, tmp_path):
    script = tmp_path / "three.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=3\nsrun hostname\n")
    out = subprocess.run(
        ["sbatch", str(script)], env=cluster.env, capture_output=True, text=True, timeout=60
    )
    print(out.stderr.strip())
    assert out.returncode != 0
    assert "Batch job submission failed" in out.stderr


@lane
def test_down_leaves_no_daemon_namespace_or_port(cluster):
    start = time.monotonic()
    localcluster.down()
    TIMINGS["down"] = time.monotonic() - start
    assert localcluster.daemons() == {} and localcluster.holders() == {}
    ps = subprocess.run(["ps", "-eo", "pid,stat,comm,args"], capture_output=True, text=True)
    daemon = re.compile(r"^\s*\d+ (?!Z)\S+\s+(slurm\S*|munged)\s|mgl-slurm-node")
    left = [ln for ln in ps.stdout.splitlines() if daemon.search(ln)]
    print("ps after down:", left or "no slurmctld, slurmd, slurmstepd, munged or node holder")
    assert left == [], left
    ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    assert not re.search(rf":({localcluster.CTLD_PORT}|{localcluster.SLURMD_PORT})\b", ss), ss
    assert not re.search(r"slurm|munge", ss), ss
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "mglsl" not in links
    assert slurm.find() is None  # the notebook's dry run again
