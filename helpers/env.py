"""The environment doctor: what hardware and software this machine offers for multi-GPU training.

GPU facts come from NVML (nvidia-ml-py) or ``nvidia-smi`` and never from ``torch.cuda``: a
notebook kernel that initialised CUDA can no longer fork workers safely, so the doctor must be
safe to call from any kernel. Run it as ``python -m helpers.env`` (table) or ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from helpers.messages import _

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
SHM_MIN_BYTES = 1 << 30  # below 1 GiB, DataLoader workers crash with "bus error" on real batches


@dataclass
class Check:
    """One line of the doctor's table: a status and, unless it passed, how to fix it."""

    name: str
    status: str
    detail: str
    hint: str = ""


@dataclass
class GPU:
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int


@dataclass
class GPUInfo:
    """What the driver reports, read without touching CUDA in this process."""

    source: str  # "nvml", "nvidia-smi" or "none"
    driver: str | None = None
    gpus: list[GPU] = field(default_factory=list)
    error: str | None = None

    @property
    def count(self) -> int:
        return len(self.gpus)


def _gpus_from_nvml() -> GPUInfo:
    import pynvml  # provided by nvidia-ml-py

    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            gpus.append(GPU(i, name, int(mem.total), int(mem.used)))
        driver = driver.decode() if isinstance(driver, bytes) else driver
        return GPUInfo("nvml", driver, gpus)
    finally:
        pynvml.nvmlShutdown()


def _gpus_from_smi() -> GPUInfo:
    query = "index,name,memory.total,memory.used,driver_version"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    gpus, driver = [], None
    for line in out.strip().splitlines():
        index, name, total, used, driver = (part.strip() for part in line.split(","))
        gpus.append(GPU(int(index), name, int(total) << 20, int(used) << 20))
    return GPUInfo("nvidia-smi", driver, gpus)


def _visible(info: GPUInfo) -> GPUInfo:
    """Restrict to CUDA_VISIBLE_DEVICES (by index) so counts match what torch will see."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not info.gpus:
        return info
    wanted = [v.strip() for v in visible.split(",") if v.strip()]
    if all(v.isdigit() for v in wanted):
        info.gpus = [g for g in info.gpus if str(g.index) in wanted]
    return info


def gpu_info() -> GPUInfo:
    """GPUs via NVML, else ``nvidia-smi``, else none; the reason for "none" is kept."""
    errors = []
    try:
        return _visible(_gpus_from_nvml())
    except Exception as exc:  # no library, no driver, no device: all mean "try the next way"
        errors.append(f"NVML: {exc}")
    if shutil.which("nvidia-smi"):
        try:
            return _visible(_gpus_from_smi())
        except Exception as exc:
            errors.append(f"nvidia-smi: {exc}")
    else:
        errors.append("nvidia-smi: not on PATH")
    return GPUInfo("none", error="; ".join(errors))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free right now (bind to port 0), never a hard-coded 29500."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def torch_facts() -> dict[str, Any]:
    """Build facts of the installed torch, read without initialising CUDA."""
    import torch
    import torch.distributed as dist

    nccl = None
    if dist.is_available() and dist.is_nccl_available():
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:
            nccl = "available"
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.version.cuda else None,
        "distributed": dist.is_available(),
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": nccl,
        "mps": mps,
    }


def device_plan(gpus: GPUInfo | None = None) -> dict[str, Any]:
    """The device, backend and worker count a lesson should use on this machine."""
    gpus = gpu_info() if gpus is None else gpus
    if gpus.count:
        return {"device": "cuda", "backend": "nccl", "nproc": gpus.count}
    try:
        import torch

        if torch.backends.mps.is_available():
            return {"device": "mps", "backend": "gloo", "nproc": 1}
    except Exception:
        pass
    return {"device": "cpu", "backend": "gloo", "nproc": 2}


def hardware_summary(gpus: GPUInfo | None = None) -> dict[str, Any]:
    """The hardware block of metrics.json: what a regression report must match before comparing."""
    gpus = gpu_info() if gpus is None else gpus
    import torch

    return {
        **device_plan(gpus),
        "gpu_count": gpus.count,
        "gpu_names": [g.name for g in gpus.gpus],
        "driver": gpus.driver,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _gpu_checks(gpus: GPUInfo, facts: dict[str, Any]) -> list[Check]:
    if not gpus.count:
        return [
            Check(
                "gpus",
                WARN,
                _("no NVIDIA GPU visible ({error})").format(error=gpus.error),
                _("Fine for learning: lessons run on CPU with gloo and 2 processes."),
            )
        ]
    names = ", ".join(
        f"{g.index}:{g.name} {g.memory_used_bytes >> 20}/{g.memory_total_bytes >> 20} MiB"
        for g in gpus.gpus
    )
    checks = [Check("gpus", PASS, f"{gpus.count} via {gpus.source}, driver {gpus.driver}: {names}")]
    if not facts["cuda_build"]:
        checks.append(
            Check(
                "torch_cuda_build",
                FAIL,
                _("torch is a CPU-only build on a GPU machine"),
                _("Reinstall torch with a CUDA build: https://pytorch.org/get-started/"),
            )
        )
    if not facts["nccl"]:
        checks.append(
            Check(
                "nccl",
                FAIL,
                _("GPUs present but torch has no NCCL"),
                _("Install a CUDA build of torch for Linux (NCCL ships with it)."),
            )
        )
    return checks


def run_checks(gpus: GPUInfo | None = None) -> list[Check]:
    """Every check the doctor knows, each PASS, WARN or FAIL with a fix hint."""
    gpus = gpu_info() if gpus is None else gpus
    facts = torch_facts()
    checks = [
        Check("python", PASS, f"{platform.python_version()} ({sys.executable})"),
        Check(
            "torch",
            PASS,
            f"{facts['torch']}, CUDA build {facts['cuda_build']}, cuDNN {facts['cudnn']}",
        ),
    ]
    checks += _gpu_checks(gpus, facts)
    if gpus.count == 0:
        checks.append(
            Check(
                "nccl",
                PASS if facts["nccl"] else WARN,
                "NCCL " + (facts["nccl"] or _("not in this build")),
                "" if facts["nccl"] else _("Only needed on NVIDIA GPUs; gloo covers CPU."),
            )
        )
    elif facts["nccl"]:
        checks.append(Check("nccl", PASS, f"NCCL {facts['nccl']}"))
    checks.append(
        Check(
            "gloo",
            PASS if facts["gloo"] else FAIL,
            _("available") if facts["gloo"] else _("torch.distributed has no gloo"),
            "" if facts["gloo"] else _("Install an official torch wheel (gloo is built in)."),
        )
    )
    checks.append(
        Check("mps", PASS, _("available") if facts["mps"] else _("not present (Apple only)"))
    )
    cores = os.cpu_count() or 1
    checks.append(
        Check(
            "cpu_cores",
            PASS if cores >= 2 else WARN,
            str(cores),
            "" if cores >= 2 else _("2 CPU workers will share one core: slow but correct."),
        )
    )
    shm = shm_bytes()
    if shm is None:
        checks.append(
            Check("dev_shm", WARN, _("no /dev/shm"), _("DataLoader workers need shared memory."))
        )
    else:
        ok = shm >= SHM_MIN_BYTES
        checks.append(
            Check(
                "dev_shm",
                PASS if ok else WARN,
                f"{shm / 2**30:.1f} GiB",
                ""
                if ok
                else _(
                    "Too small for DataLoader workers: run Docker with "
                    "--shm-size=8g (or --ipc=host)."
                ),
            )
        )
    try:
        checks.append(Check("free_port", PASS, str(free_port())))
    except OSError as exc:
        checks.append(
            Check(
                "free_port",
                FAIL,
                str(exc),
                _("Loopback networking is needed for the rendezvous; check the firewall."),
            )
        )
    return checks


def format_table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.name:{width}}  {c.detail}")
        if c.hint and c.status != PASS:
            lines.append(f"{'':4}  {'':{width}}  -> {c.hint}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.env", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    gpus = gpu_info()
    checks = run_checks(gpus)
    if args.json:
        print(
            json.dumps(
                {"checks": [asdict(c) for c in checks], "hardware": hardware_summary(gpus)},
                indent=2,
            )
        )
    else:
        print(format_table(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
