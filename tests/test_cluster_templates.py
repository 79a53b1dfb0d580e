"""The cluster templates of notebook 09: the Slurm sbatch template and the Kubeflow PyTorchJob.

No cluster is needed: the Slurm script is rendered, syntax-checked with ``bash -n`` and run
with stand-ins for ``scontrol`` and ``srun``; the PyTorchJob is loaded as YAML, checked for
the fields the training operator needs, and its container command is run with the variables
the operator sets and stand-ins for ``python`` and ``torchrun``.
"""

from __future__ import annotations

import re
import shutil
import string
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SBATCH = REPO / "cluster" / "slurm" / "train.sbatch.template"
PYTORCHJOB = REPO / "cluster" / "kubernetes" / "pytorchjob.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Z][A-Z0-9_]*)\}")


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


# ------------------------------------------------------------------ Slurm


def slurm_values(tmp_path: Path) -> dict[str, object]:
    return {
        "JOB_NAME": "mnist-ddp",
        "NODES": 3,
        "GPUS_PER_NODE": 8,
        "CPUS_PER_TASK": 64,
        "TIME_LIMIT": "02:00:00",
        "PORT": 29511,
        "NET_IFNAME": "ib0",
        "MAX_RESTARTS": 2,
        "EPOCHS": 4,
        "REPO": tmp_path / "repo",
        "PYTHON": tmp_path / "bin" / "python",
        "DATA_DIR": tmp_path / "data",
        "SHARED_DIR": tmp_path / "shared",
    }


def render(values: dict[str, object]) -> str:
    return string.Template(SBATCH.read_text()).safe_substitute(values)


def test_every_placeholder_is_known_and_filled(tmp_path):
    values = slurm_values(tmp_path)
    assert set(PLACEHOLDER.findall(SBATCH.read_text())) == set(values)
    assert PLACEHOLDER.findall(render(values)) == []


def test_sbatch_header_asks_for_one_agent_per_node(tmp_path):
    header = [ln for ln in render(slurm_values(tmp_path)).splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=3" in header
    assert "#SBATCH --ntasks-per-node=1" in header
    assert "#SBATCH --gpus-per-node=8" in header
    assert "#SBATCH --job-name=mnist-ddp" in header


def test_rendered_script_passes_bash_n(tmp_path):
    script = tmp_path / "train.sbatch"
    script.write_text(render(slurm_values(tmp_path)))
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_head_node_discovery_and_the_torchrun_command(tmp_path):
    """Run the job script with fake scontrol/srun/python: what would every node run?"""
    values = slurm_values(tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    _stub(fake, "scontrol", 'echo "$@" > "$FAKE/scontrol_args"; printf "%s\\n" gpu07 gpu08 gpu09')
    _stub(fake, "srun", 'printf "%s\\n" "$@" > "$FAKE/srun_args"; env > "$FAKE/srun_env"')
    _stub(fake, "python", 'echo "$PWD" > "$FAKE/python_cwd"; echo "$2" >> "$FAKE/python_calls"')
    script = tmp_path / "train.sbatch"
    script.write_text(render(values))
    slurm = {
        "SLURM_JOB_NODELIST": "gpu[07-09]",
        "SLURM_NNODES": "3",
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NAME": "mnist-ddp",
        "SLURM_CPUS_PER_TASK": "64",
    }
    env = {"PATH": f"{fake}:/usr/bin:/bin", "FAKE": str(fake), **slurm}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (fake / "scontrol_args").read_text().split() == ["show", "hostnames", "gpu[07-09]"]
    srun = (fake / "srun_args").read_text().splitlines()
    # --cpus-per-task: since Slurm 22.05 srun no longer inherits it from sbatch
    assert srun[:5] == [
        "--kill-on-bad-exit=1",
        "--cpus-per-task=64",
        str(values["PYTHON"]),
        "-m",
        "torch.distributed.run",
    ]
    assert "--nnodes=3" in srun and "--nproc-per-node=8" in srun
    assert "--rdzv-backend=c10d" in srun
    assert "--rdzv-endpoint=gpu07:29511" in srun  # the first node of the allocation
    assert "--rdzv-id=777" in srun and "--max-restarts=2" in srun
    assert srun[srun.index("--epochs") + 1] == "4"
    assert srun[srun.index("--checkpoint") + 1] == str(tmp_path / "shared" / "mnist-ddp.pt")
    out = tmp_path / "shared" / "mnist-ddp-777"
    assert srun[srun.index("--out") + 1] == str(out)  # rank 0's weights, outside the checkout
    assert out.is_dir()  # rank outputs land there
    assert (fake / "python_cwd").read_text().strip() == str(out)  # never inside the checkout
    assert "load_mnist" in (fake / "python_calls").read_text()  # data staged before the nodes
    assert str(tmp_path / "repo" / "scripts" / "ddp_elastic.py") in srun  # the committed copy
    srun_env = dict(line.split("=", 1) for line in (fake / "srun_env").read_text().splitlines())
    assert srun_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # with --max-restarts
    assert srun_env["OMP_NUM_THREADS"] == "8"  # 64 CPUs per node / 8 GPUs


@pytest.mark.skipif(shutil.which("envsubst") is None, reason="envsubst (gettext-base) missing")
def test_envsubst_renders_the_same(tmp_path):
    values = {k: str(v) for k, v in slurm_values(tmp_path).items()}
    names = " ".join(f"${{{k}}}" for k in values)
    proc = subprocess.run(
        ["envsubst", names],
        input=SBATCH.read_text(),
        env=values,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == render(values)


# ------------------------------------------------------------------ Kubernetes


@pytest.fixture(scope="module")
def job() -> dict:
    return yaml.safe_load(PYTORCHJOB.read_text())


def _container(job: dict, kind: str) -> dict:
    containers = job["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "pytorch")


def test_pytorchjob_has_what_the_operator_needs(job):
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"}
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    for kind, spec in specs.items():
        assert spec["restartPolicy"] in ("OnFailure", "Always", "ExitCode", "Never"), kind
        container = _container(job, kind)  # the operator finds it by this name
        assert container["image"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert "pytorchjob-port" in ports
    assert isinstance(job["spec"]["nprocPerNode"], str)  # the API field is a string


def test_one_process_per_gpu_and_a_memory_backed_shm(job):
    nproc = int(job["spec"]["nprocPerNode"])
    for kind in job["spec"]["pytorchReplicaSpecs"]:
        pod = job["spec"]["pytorchReplicaSpecs"][kind]["template"]["spec"]
        container = _container(job, kind)
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == nproc
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        shm = volumes[mounts["/dev/shm"]]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert "persistentVolumeClaim" in volumes[mounts["/shared"]]  # shared checkpoints


def operator_env(job: dict, pod_index: int) -> dict[str, str]:
    """What the training operator (v1.7+) sets in pod ``pod_index`` (0 = Master)."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    pods = sum(s["replicas"] for s in specs.values())
    nproc = int(job["spec"]["nprocPerNode"])
    port = {p["name"]: p["containerPort"] for p in _container(job, "Master")["ports"]}
    return {
        "MASTER_ADDR": f"{job['metadata']['name']}-master-0",
        "MASTER_PORT": str(port["pytorchjob-port"]),
        "WORLD_SIZE": str(pods * nproc),
        "RANK": str(pod_index),
        "PET_NNODES": str(pods),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NODE_RANK": str(pod_index),
    }


@pytest.mark.parametrize("kind, index", [("Master", 0), ("Worker", 1)])
def test_container_command_maps_the_operator_env_to_torchrun(job, kind, index, tmp_path):
    container = _container(job, kind)
    fake = tmp_path / "bin"
    fake.mkdir()
    _stub(fake, "python", "exit 0")
    _stub(fake, "torchrun", 'printf "%s\\n" "$@" > "$FAKE/torchrun_args"')
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    env |= {
        "MULTIGPU_LAB_OUT": str(tmp_path / "out"),
        "FAKE": str(fake),
        "PATH": f"{fake}:/usr/bin:/bin",
        **operator_env(job, index),
    }
    proc = subprocess.run(
        [*container["command"], *container["args"]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    args = (fake / "torchrun_args").read_text().splitlines()
    pods = sum(s["replicas"] for s in job["spec"]["pytorchReplicaSpecs"].values())
    assert f"--nnodes={pods}" in args  # pods, not WORLD_SIZE (= processes)
    assert f"--nproc-per-node={job['spec']['nprocPerNode']}" in args
    assert "--rdzv-backend=c10d" in args
    assert f"--rdzv-endpoint={job['metadata']['name']}-master-0:23456" in args
    assert "scripts/ddp_elastic.py" in args  # the committed copy, run from the kit's folder
    assert args[args.index("--out") + 1] == str(tmp_path / "out")  # not into the kit's folder
    if any(a.startswith("--max-restarts=") and a != "--max-restarts=0" for a in args):
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a fresh store per restart


def test_worker_pods_use_the_master_template(job):
    """The manifest writes the pod once (YAML anchor) and the Worker reuses it (alias)."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Worker"]["template"] == specs["Master"]["template"]
