"""The device plan and CUDA_VISIBLE_DEVICES, decided from a faked device inventory.

The inventory (``helpers.env.GPUInfo``, what NVML or nvidia-smi report) is the one seam: the
tests build 0, 1, 2, 3 or 8 fake GPUs and check what every lesson would do on such a machine.
Nothing inside torch is replaced.
"""

from __future__ import annotations

import pytest
import torch

from helpers import env, launch
from helpers.placement import stage_devices

A100 = "NVIDIA A100-SXM4-80GB"


def gpu(i: int, name: str = A100) -> env.GPU:
    return env.GPU(i, name, 80 << 30, 0, f"GPU-{i}{i}c0ffee-1234-5678-9abc-{i:012d}")


def machine(n: int, *, mps: bool = False, names: list[str] | None = None) -> env.GPUInfo:
    names = names or [A100] * n
    return env.GPUInfo("nvml", "999.1", [gpu(i, names[i]) for i in range(n)], mps=mps)


# ------------------------------------------------------------------ device_plan


@pytest.mark.parametrize(
    ("gpus", "needs", "expected"),
    [
        (0, {}, ("cpu", "cpu", "gloo", 2)),
        (1, {}, ("cuda", "cuda", "nccl", 1)),
        (2, {}, ("cuda", "cuda", "nccl", 2)),
        (8, {}, ("cuda", "cuda", "nccl", 8)),
        (8, {"min_ranks": 2, "max_ranks": 2}, ("cuda", "cuda", "nccl", 2)),  # 03's pipeline
        (2, {"min_ranks": 2}, ("cuda", "cuda", "nccl", 2)),
        (1, {"min_ranks": 2}, ("cpu", "cpu", "gloo", 2)),  # 02 on one GPU
        (3, {"min_ranks": 4, "max_ranks": 4}, ("cpu", "cpu", "gloo", 4)),  # a 2x2 mesh
        (0, {"max_ranks": 1}, ("cpu", "cpu", "gloo", 1)),  # 00 with world_size = 1
    ],
)
def test_plan_for_each_machine(gpus, needs, expected):
    plan = env.device_plan(machine(gpus), **needs)
    assert (plan["device"], plan["worker_device"], plan["backend"], plan["nproc"]) == expected
    assert plan["why"]


def test_one_gpu_gives_two_cpu_ranks_where_a_lesson_needs_two_and_says_why():
    """Issue 21.3 on a faked 1-GPU machine: rank 1 exists, DDP is not compared with itself."""
    one_gpu = machine(1)
    ddp = env.device_plan(one_gpu, min_ranks=2)  # notebook 02
    assert ddp["nproc"] == 2 and ddp["backend"] == "gloo"  # rank 1 exists to be killed
    assert ddp["nproc"] != 1  # the proof compares 2 ranks with 1 process, not a run with itself
    assert "1 GPU(s)" in ddp["why"] and "one NCCL rank" in ddp["why"]
    pipeline = env.device_plan(one_gpu, min_ranks=2, max_ranks=2)  # notebook 10
    assert pipeline["worker_device"] == "cpu" and pipeline["nproc"] == 2
    assert stage_devices(2, one_gpu).devices == [torch.device("cpu")] * 2
    assert env.device_plan(one_gpu)["backend"] == "nccl"  # 00, 07: a world of one on the GPU


def test_apple_silicon_trains_on_mps_in_the_notebook_and_on_cpu_in_workers():
    plan = env.device_plan(machine(0, mps=True))
    assert plan["device"] == "mps" and plan["worker_device"] == "cpu"
    assert plan["backend"] == "gloo" and plan["nproc"] == 2 and "MPS" in plan["why"]
    assert env.device_plan(machine(0, mps=True), min_ranks=2)["device"] == "cpu"


def test_impossible_needs_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="min_ranks <= max_ranks"):
        env.device_plan(machine(2), min_ranks=3, max_ranks=2)
    with pytest.raises(ValueError, match="min_ranks"):
        env.device_plan(machine(2), min_ranks=0)


def test_cpu_workers_are_told_there_is_no_gpu_and_cuda_workers_get_pci_order(monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert launch.worker_env("cpu") == {"CUDA_VISIBLE_DEVICES": ""}
    assert launch.worker_env("cuda") == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_cpu_job_on_a_gpu_machine_really_hides_the_gpus(tmp_path, no_orphans):
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, torch\n"
        "from helpers.launch import write_rank_output\n"
        "write_rank_output({'visible': os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
        "                   'cuda': torch.cuda.is_available()})\n"
    )
    result = launch.torchrun(script, nproc=2, device="cpu", out_dir=tmp_path / "out", timeout=180)
    assert [result.rank(r) for r in (0, 1)] == [{"visible": "", "cuda": False}] * 2


# ------------------------------------------------------------ CUDA_VISIBLE_DEVICES


def indices(value: str | None, n: int = 4, **kw) -> list[int]:
    seen, _ = env.visible_devices(machine(n).gpus, value, **kw)
    return [g.index for g in seen]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("2,3", [2, 3]),  # GPU 2 becomes cuda:0
        ("3,1", [3, 1]),  # order kept
        (" 1, 0", [1, 0]),  # spaces ignored
        ("1gpu", [1]),  # read like strtoul
        ("GPU-22", [2]),  # a UUID prefix naming one GPU
        ("GPU-1", [1]),
        ("0,7,1", [0]),  # the first entry naming no device ends the list
        ("0,-1,1", [0]),
        ("-1", []),
        ("", []),
        ("1,1", []),  # a device named twice hides them all
        ("2,GPU-22", []),  # also when named twice in two ways
        ("GPU-", []),  # an ambiguous prefix names nothing
        ("nvidia0", []),
    ],
)
def test_visible_devices_read_like_cuda(value, expected):
    assert indices(value) == expected


def test_notes_say_why_cuda_sees_less_than_the_driver_lists():
    _, notes = env.visible_devices(machine(4).gpus, "0,7,1")
    assert notes and "'7'" in notes[0] and "1 before it" in notes[0]
    _, notes = env.visible_devices(machine(4).gpus, "-1")
    assert notes == ["CUDA_VISIBLE_DEVICES='-1' hides every GPU"]
    _, notes = env.visible_devices(machine(4).gpus, "1,1")
    assert "twice" in notes[0]
    assert env.visible_devices(machine(4).gpus, "2,3") == (machine(4).gpus[2:], [])


def test_mixed_models_warn_that_cuda_order_may_differ_unless_pci_order():
    mixed = machine(2, names=["NVIDIA RTX A4000", "NVIDIA RTX 4090"]).gpus
    _, notes = env.visible_devices(mixed, None)
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in notes)
    assert env.visible_devices(mixed, None, order="PCI_BUS_ID")[1] == []


def test_mig_instances_are_named_by_uuid():
    parent = gpu(0, "NVIDIA H100 80GB HBM3")
    mig = [env.GPU(0, "NVIDIA H100 80GB HBM3 MIG", 10 << 30, 0, f"MIG-{i}f0e-aaaa") for i in "ab"]
    seen, notes = env.visible_devices([parent], "MIG-bf0e", mig)
    assert seen == [mig[1]] and notes == []
    seen, notes = env.visible_devices([parent], None, mig)
    assert seen == [parent] and "MIG mode" in notes[0]


def test_gpu_info_applies_the_variable_and_cuda_names_use_cuda_numbers(monkeypatch):
    monkeypatch.setattr(env, "_driver_inventory", lambda: machine(4))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    gpus = env.gpu_info()
    assert gpus.count == 2
    assert env.cuda_names(gpus) == [f"cuda:0 = GPU 2 ({A100})", f"cuda:1 = GPU 3 ({A100})"]
    assert "cuda:0 = GPU 2" in stage_devices(2, gpus).reason
    assert env.device_plan(gpus)["nproc"] == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    hidden = env.gpu_info()
    assert hidden.count == 0 and env.device_plan(hidden)["backend"] == "gloo"
    gpus_check = next(c for c in env.run_checks(hidden) if c.name == "gpus")
    assert gpus_check.status == env.WARN and "hides every GPU" in gpus_check.detail


def test_doctor_warns_about_each_note():
    gpus = machine(2, names=["NVIDIA RTX A4000", "NVIDIA RTX 4090"])
    gpus.notes = env.visible_devices(gpus.gpus, None)[1]
    checks = env._gpu_checks(gpus, {"cuda_build": "13.0", "nccl": "2.30.7"})
    assert [c.status for c in checks if c.name == "visible_devices"] == [env.WARN]
    assert "cuda:1 = GPU 1 (NVIDIA RTX 4090)" in checks[0].detail
