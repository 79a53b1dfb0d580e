"""The environment doctor: valid JSON with every check, fix hints, no CUDA initialisation."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import env

CHECK_NAMES = {
    "python",
    "torch",
    "gpus",
    "nccl",
    "gloo",
    "mps",
    "cpu_cores",
    "dev_shm",
    "free_port",
}


def test_json_lists_every_check_and_exits_zero_without_gpus(no_orphans):
    out = subprocess.run(
        [sys.executable, "-m", "helpers.env", "--json"], capture_output=True, text=True, timeout=120
    )
    report = json.loads(out.stdout)
    names = {c["name"] for c in report["checks"]}
    assert CHECK_NAMES <= names
    assert all(c["status"] in ("PASS", "WARN", "FAIL") for c in report["checks"])
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    assert out.returncode == (1 if failed else 0)
    if report["hardware"]["gpu_count"] == 0:
        gpus = next(c for c in report["checks"] if c["name"] == "gpus")
        assert gpus["status"] == "WARN" and gpus["hint"]


def test_table_shows_hints_for_non_passing_checks():
    checks = [env.Check("gpus", env.WARN, "none", "run on CPU"), env.Check("x", env.PASS, "ok")]
    table = env.format_table(checks)
    assert "WARN  gpus" in table and "-> run on CPU" in table


def test_cpu_only_torch_on_a_gpu_machine_fails_with_a_fix():
    gpus = env.GPUInfo("nvml", "550.1", [env.GPU(0, "Fake H100", 80 << 30, 1 << 30)])
    checks = env._gpu_checks(gpus, {"cuda_build": None, "nccl": None})
    by_name = {c.name: c for c in checks}
    assert by_name["gpus"].status == env.PASS
    assert by_name["torch_cuda_build"].status == env.FAIL
    assert "CUDA build" in by_name["torch_cuda_build"].hint


def test_small_dev_shm_is_a_warning(monkeypatch):
    monkeypatch.setattr(env, "shm_bytes", lambda: 64 << 20)
    shm = next(c for c in env.run_checks(env.GPUInfo("none")) if c.name == "dev_shm")
    assert shm.status == env.WARN and "--shm-size" in shm.hint


def test_doctor_does_not_initialise_cuda(no_orphans):
    code = (
        "import torch, helpers.env as e; e.run_checks(); e.hardware_summary(); "
        "print(torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_free_port_is_bindable():
    port = env.free_port()
    assert 0 < port < 65536 and env.port_is_free(port)


def test_device_plan_without_gpus_uses_two_cpu_workers():
    plan = env.device_plan(env.GPUInfo("none"))
    assert plan == {
        "device": "cpu",
        "worker_device": "cpu",
        "backend": "gloo",
        "nproc": 2,
        "why": "no NVIDIA GPU visible, so 2 CPU processes with gloo",
    }
