"""The cluster templates of notebook 14: Slurm, a Kubeflow Trainer TrainJob, a legacy PyTorchJob.

No cluster is needed here: the Slurm script is rendered in its GPU and CPU forms, syntax-checked
with ``bash -n`` and run with stand-ins for ``scontrol`` and ``srun`` (tests/test_slurm_cluster.py
submits it to a real two-node Slurm cluster). The TrainJob (Kubeflow Trainer v2) is validated
with jsonschema against the TrainJob schema of the Trainer's own API models
(cluster/kubernetes/trainjob.schema.json, from PyPI's kubeflow-trainer-api), and its command is
run with the ``PET_*`` variables the ``torch-distributed`` runtime sets. The PyTorchJob
(training operator v1) is loaded as YAML, checked for the fields the training operator needs,
and its container command is run with the variables the operator sets. Both use stand-ins for
``python`` and ``torchrun``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import string
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SBATCH = REPO / "cluster" / "slurm" / "train.sbatch.template"
PYTORCHJOB = REPO / "cluster" / "kubernetes" / "pytorchjob.yaml"
TRAINJOB = REPO / "cluster" / "kubernetes" / "trainjob.yaml"
TRAINJOB_SCHEMA_FILE = REPO / "cluster" / "kubernetes" / "trainjob.schema.json"
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
        "WORKERS_PER_NODE": 8,
        "GRES": "gpu:8",
        "CPUS_PER_TASK": 64,
        "TIME_LIMIT": "02:00:00",
        "PORT": 29511,
        "NET_IFNAME": "ib0",
        "MAX_RESTARTS": 2,
        "EPOCHS": 4,
        "CHECKPOINT_EVERY": 100,
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
    assert "#SBATCH --gres=gpu:8" in header
    assert "#SBATCH --job-name=mnist-ddp" in header
    # a requeued job (a node lost) starts again under the same id: its output is appended
    assert "#SBATCH --requeue" in header and "#SBATCH --open-mode=append" in header


def test_the_cpu_form_requests_no_gpu(tmp_path):
    """CPU nodes: sbatch refuses any GPU request there (Slurm 22.05: "Invalid generic resource
    (gres) specification"); --gres=none asks for none, and the worker count stands alone."""
    values = slurm_values(tmp_path) | {"GRES": "none", "WORKERS_PER_NODE": 2}
    text = render(values)
    header = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --gres=none" in header
    assert not [ln for ln in header if "gpu" in ln]
    assert "--nproc-per-node=2 " in text
    # workers on CPU even where the node's GPUs are visible to every job
    assert 'if [ "none" = none ]; then export CUDA_VISIBLE_DEVICES=""; fi' in text


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
    assert srun[:6] == [
        "--kill-on-bad-exit=1",
        "--cpus-per-task=64",
        "--label",  # each line says which node (task) printed it
        str(values["PYTHON"]),
        "-m",
        "torch.distributed.run",
    ]
    assert "--nnodes=3" in srun and "--nproc-per-node=8" in srun
    assert "--rdzv-backend=c10d" in srun
    assert "--rdzv-endpoint=gpu07:29511" in srun  # the first node of the allocation
    assert "--rdzv-id=777" in srun and "--max-restarts=2" in srun
    assert srun[srun.index("--epochs") + 1] == "4"
    assert srun[srun.index("--checkpoint-every") + 1] == "100"
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
    assert "CUDA_VISIBLE_DEVICES" not in srun_env  # the GPU form leaves Slurm's choice alone


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


# ------------------------------------------------------------------ Kubernetes: Trainer v2

# The TrainJob's schema from the Trainer's own API models (PyPI kubeflow-trainer-api, generated
# from the Trainer's OpenAPI spec; cluster/kubernetes/trainjob_schema.py says how and why), with
# unknown fields refused as the API server's strict field validation does.
TRAINJOB_SCHEMA = json.loads(TRAINJOB_SCHEMA_FILE.read_text())
RFC1035 = re.compile(
    r"[a-z]([-a-z0-9]*[a-z0-9])?"
)  # a TrainJob's name: pods and DNS derive from it
# The torch runtime sets these itself and refuses a TrainJob whose trainer.env sets one.
PET_RESERVED = {
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
}


@pytest.fixture(scope="module")
def trainjob() -> dict:
    return yaml.safe_load(TRAINJOB.read_text())


def test_trainjob_matches_the_trainer_v2_schema(trainjob):
    jsonschema.Draft202012Validator(TRAINJOB_SCHEMA).validate(trainjob)
    name = trainjob["metadata"]["name"]
    assert RFC1035.fullmatch(name) and len(name) <= 63, name
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    trainer = trainjob["spec"]["trainer"]
    assert trainer["image"] and trainer["command"] and trainer["numNodes"] >= 2
    assert not PET_RESERVED & {e["name"] for e in trainer["env"]}


@pytest.mark.parametrize(
    "path, value",
    [
        (("spec", "trainer", "numNode"), 2),  # a typo of numNodes
        (("spec", "trainer", "numNodes"), "2"),  # a string where Kubernetes wants an integer
        (("spec", "runtimeRef", "name"), None),  # no runtime named
        (("spec", "podTemplateOverrides"), []),  # the Trainer v2.0/v2.1 name, gone in v2.2
        (("apiVersion",), "kubeflow.org/v1"),
        (("spec", "trainer", "resourcesPerNode", "limit"), {}),  # a typo of limits
    ],
    ids=["typo", "string-count", "no-runtime", "v2.1-field", "v1-api", "nested-typo"],
)
def test_the_schema_catches_what_the_trainer_would_refuse(trainjob, path, value):
    broken = yaml.safe_load(yaml.safe_dump(trainjob))  # a deep copy
    where = broken
    for key in path[:-1]:
        where = where[key]
    if value is None:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(TRAINJOB_SCHEMA).validate(broken)


def test_a_typo_deep_in_the_runtime_patch_is_caught(trainjob):
    """The pod spec patched into the runtime is typed down to each volume mount."""
    broken = yaml.safe_load(yaml.safe_dump(trainjob))
    container = next(c for c in _node_pod_patch(broken)["containers"] if c["name"] == "node")
    container["volumeMounts"][0]["mountpath"] = container["volumeMounts"][0].pop("mountPath")
    with pytest.raises(jsonschema.ValidationError, match="mountpath"):
        jsonschema.Draft202012Validator(TRAINJOB_SCHEMA).validate(broken)


def test_the_schema_file_is_what_the_trainer_api_package_gives():
    """Where kubeflow-trainer-api is installed, the committed schema is regenerated from it."""
    pytest.importorskip("kubeflow_trainer_api", reason="kubeflow-trainer-api not installed")
    spec = importlib.util.spec_from_file_location(
        "trainjob_schema", REPO / "cluster/kubernetes/trainjob_schema.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.schema() == TRAINJOB_SCHEMA


def _node_pod_patch(trainjob: dict) -> dict:
    """The pod spec that the runtime patches add to the runtime's ``node`` job."""
    [patch] = trainjob["spec"]["runtimePatches"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return next(j for j in jobs if j["name"] == "node")["template"]["spec"]["template"]["spec"]


def test_trainjob_one_process_per_gpu_shm_and_shared_volume(trainjob):
    trainer = trainjob["spec"]["trainer"]
    gpus = int(trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"])
    assert gpus == trainer["numProcPerNode"]
    pod = _node_pod_patch(trainjob)
    container = next(c for c in pod["containers"] if c["name"] == "node")  # the runtime's name
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/shared"]]  # shared checkpoints
    assert pod["securityContext"]["fsGroup"] == 1000  # the image's user can write there


def runtime_env(trainjob: dict, pod_index: int) -> dict[str, str]:
    """What the torch-distributed runtime sets in node pod ``pod_index`` (Trainer v2)."""
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    return {
        "PET_NNODES": str(trainer["numNodes"]),
        "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
        "PET_NODE_RANK": str(pod_index),
        "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
        "PET_MASTER_PORT": "29500",
    }


def torchrun_args(command: list[str], env: dict, injected: dict, tmp_path: Path) -> list[str]:
    """Dry-run a pod's command with the variables the operator injects and stand-ins for
    ``python`` and ``torchrun``: the arguments torchrun would have been given, one per line."""
    fake = tmp_path / "bin"
    fake.mkdir()
    _stub(fake, "python", "exit 0")
    _stub(fake, "torchrun", 'printf "%s\\n" "$@" > "$FAKE/torchrun_args"')
    variables = env | {
        "MULTIGPU_LAB_OUT": str(tmp_path / "out"),
        "FAKE": str(fake),
        "PATH": f"{fake}:/usr/bin:/bin",
        **injected,
    }
    proc = subprocess.run(command, env=variables, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return (fake / "torchrun_args").read_text().splitlines()


@pytest.mark.parametrize("index", [0, 1])
def test_trainjob_command_runs_torchrun_with_the_runtime_env(trainjob, index, tmp_path):
    trainer = trainjob["spec"]["trainer"]
    command = [*trainer["command"], *trainer["args"]]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    args = torchrun_args(command, env, runtime_env(trainjob, index), tmp_path)
    name = trainjob["metadata"]["name"]
    assert f"--nnodes={trainer['numNodes']}" in args
    assert f"--nproc-per-node={trainer['numProcPerNode']}" in args
    assert "--rdzv-backend=c10d" in args
    assert f"--rdzv-endpoint={name}-node-0-0.{name}:29500" in args  # pod 0 hosts the store
    assert f"--rdzv-conf=is_host={int(index == 0)}" in args  # told, not guessed
    assert "scripts/ddp_elastic.py" in args  # the committed copy, from the image's WORKDIR
    assert args[args.index("--out") + 1] == str(tmp_path / "out")
    assert args[args.index("--checkpoint") + 1].startswith("/shared/")  # on the shared volume
    assert (tmp_path / "out").is_dir()
    if any(a.startswith("--max-restarts=") and a != "--max-restarts=0" for a in args):
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a fresh store per restart


# ------------------------------------------------------------------ Kubernetes: legacy PyTorchJob


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
    command = [*container["command"], *container["args"]]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    args = torchrun_args(command, env, operator_env(job, index), tmp_path)
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
