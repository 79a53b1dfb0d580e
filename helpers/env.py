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
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
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
    """One CUDA device as the driver lists it: a whole GPU, or one MIG instance of a GPU."""

    index: int  # nvidia-smi's (NVML's) index of the GPU, which is not always CUDA's cuda:N
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    uuid: str = ""  # "GPU-…", or "MIG-…" for a MIG instance: what CUDA_VISIBLE_DEVICES may name


@dataclass
class GPUInfo:
    """What the driver reports, read without touching CUDA in this process.

    ``gpus`` is what a CUDA process started now would see, in CUDA's order: ``gpus[i]`` is
    ``cuda:i`` (CUDA_VISIBLE_DEVICES applied). ``notes`` say where that differs from the
    driver's list; ``mig`` holds MIG instances, which CUDA sees only when named by UUID.
    """

    source: str  # "nvml", "nvidia-smi" or "none"
    driver: str | None = None
    gpus: list[GPU] = field(default_factory=list)
    error: str | None = None
    mig: list[GPU] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mps: bool = False  # Apple silicon's GPU (torch.backends.mps), for single-process lessons

    @property
    def count(self) -> int:
        return len(self.gpus)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _mig_instances(pynvml: Any, handle: Any, parent: GPU) -> list[GPU]:
    """The MIG instances of one GPU (none when MIG is off or the GPU cannot do it)."""
    try:
        if pynvml.nvmlDeviceGetMigMode(handle)[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return []
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError:  # pre-Ampere GPUs answer "not supported"
        return []
    found = []
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:  # an empty slot
            continue
        mem = pynvml.nvmlDeviceGetMemoryInfo(mig)
        uuid = _text(pynvml.nvmlDeviceGetUUID(mig))
        found.append(GPU(parent.index, f"{parent.name} MIG", int(mem.total), int(mem.used), uuid))
    return found


def _gpus_from_nvml() -> GPUInfo:
    import pynvml  # provided by nvidia-ml-py

    pynvml.nvmlInit()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus, migs = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(GPU(i, _text(name), int(mem.total), int(mem.used), _text(uuid)))
            migs += _mig_instances(pynvml, handle, gpus[-1])
        return GPUInfo("nvml", driver, gpus, mig=migs)
    finally:
        pynvml.nvmlShutdown()


def _gpus_from_smi() -> GPUInfo:
    query = "index,name,memory.total,memory.used,driver_version,uuid"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    gpus, driver = [], None
    for line in out.strip().splitlines():
        index, name, total, used, driver, uuid = (part.strip() for part in line.split(","))
        gpus.append(GPU(int(index), name, int(total) << 20, int(used) << 20, uuid))
    return GPUInfo("nvidia-smi", driver, gpus)


def _named_device(entry: str, gpus: Sequence[GPU], mig: Sequence[GPU]) -> GPU | None:
    """The device one CUDA_VISIBLE_DEVICES entry names, or None where CUDA would stop reading.

    An index is read like C's strtoul (``"1gpu"`` is 1); a ``GPU-``/``MIG-`` UUID may be any
    prefix that names exactly one device.
    """
    if entry.startswith(("GPU-", "MIG-")):
        pool = mig if entry.startswith("MIG-") else gpus
        found = [g for g in pool if g.uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None
    number = re.match(r"[+-]?\d+", entry)
    index = int(number.group()) if number else -1
    return gpus[index] if 0 <= index < len(gpus) else None


def _cuda_selection(
    value: str, gpus: Sequence[GPU], mig: Sequence[GPU]
) -> tuple[list[GPU], str | None]:
    """CUDA's reading of CUDA_VISIBLE_DEVICES: the devices named, and why it stopped early."""
    chosen: list[GPU] = []
    for entry in (e.strip() for e in value.split(",")):
        device = _named_device(entry, gpus, mig)
        if device is None:  # "-1" (or nothing) ends the list on purpose: no note needed
            if entry in ("", "-1"):
                return chosen, None
            return chosen, _("{entry} names no device; CUDA sees the {n} before it").format(
                entry=repr(entry), n=len(chosen)
            )
        if any(device is c for c in chosen):
            return [], _("it names a device twice, so CUDA sees none")
        chosen.append(device)
    return chosen, None


def _order_notes(chosen: list[GPU], mig: Sequence[GPU], order: str | None) -> list[str]:
    """Where ``cuda:i`` may not be nvidia-smi's GPU ``i``, or a GPU is reached only by MIG UUID."""
    notes = []
    if len({g.name for g in chosen}) > 1 and order != "PCI_BUS_ID":
        notes.append(
            _(
                "mixed GPU models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA puts the fastest "
                "first, so cuda:i may not be nvidia-smi's GPU i; set CUDA_DEVICE_ORDER=PCI_BUS_ID"
            )
        )
    in_use = {c.index for c in chosen if c.uuid.startswith("MIG-")}
    for parent in sorted({m.index for m in mig} - in_use):
        notes.append(
            _(
                "GPU {parent} is in MIG mode: CUDA computes on a MIG instance that "
                "CUDA_VISIBLE_DEVICES names (MIG-<uuid>, listed by nvidia-smi -L)"
            ).format(parent=parent)
        )
    return notes


def visible_devices(
    gpus: Sequence[GPU], value: str | None, mig: Sequence[GPU] = (), order: str | None = None
) -> tuple[list[GPU], list[str]]:
    """The devices a CUDA process sees under ``CUDA_VISIBLE_DEVICES=value``, in its order: cuda:0, …

    Read as CUDA reads it (``torch.cuda._parse_visible_devices`` follows the same rules): entries
    are indices, ``GPU-<uuid>`` or ``MIG-<uuid>`` (a unique prefix is enough); the first entry
    that names no device ends the list, so ``-1`` or an empty value hides every GPU; a device
    named twice hides them all. The notes say so, and flag when ``order``
    (``CUDA_DEVICE_ORDER``) may make ``cuda:i`` differ from nvidia-smi's GPU ``i``.
    """
    chosen, problem = (list(gpus), None) if value is None else _cuda_selection(value, gpus, mig)
    notes = [f"CUDA_VISIBLE_DEVICES={value!r}: {problem}"] if problem else []
    if value is not None and gpus and not chosen and not problem:
        notes.append(_("CUDA_VISIBLE_DEVICES={value} hides every GPU").format(value=repr(value)))
    return chosen, notes + _order_notes(chosen, mig, order)


def _mps_available() -> bool:
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:  # no torch, or a build without the MPS backend
        return False


def _driver_inventory() -> GPUInfo:
    """GPUs via NVML, else ``nvidia-smi``, else none; the reason for "none" is kept."""
    errors = []
    try:
        return _gpus_from_nvml()
    except Exception as exc:  # no library, no driver, no device: all mean "try the next way"
        errors.append(f"NVML: {exc}")
    if shutil.which("nvidia-smi"):
        try:
            return _gpus_from_smi()
        except Exception as exc:
            errors.append(f"nvidia-smi: {exc}")
    else:
        errors.append("nvidia-smi: not on PATH")
    return GPUInfo("none", error="; ".join(errors))


def gpu_info() -> GPUInfo:
    """The GPUs a CUDA process started now would see (CUDA_VISIBLE_DEVICES applied), and MPS."""
    info = _driver_inventory()
    info.gpus, info.notes = visible_devices(
        info.gpus,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        info.mig,
        os.environ.get("CUDA_DEVICE_ORDER"),
    )
    info.mps = _mps_available()
    return info


def cuda_names(gpus: GPUInfo) -> list[str]:
    """``cuda:0 = GPU 2 (NVIDIA H100)``: the name in a process next to nvidia-smi's number."""
    return [f"cuda:{i} = GPU {g.index} ({g.name})" for i, g in enumerate(gpus.gpus)]


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


def device_plan(
    gpus: GPUInfo | None = None, *, min_ranks: int = 1, max_ranks: int | None = None
) -> dict[str, Any]:
    """Where a lesson computes and how many processes it starts: every lesson asks here.

    Returns ``device`` (``cuda``, ``mps`` for single-process work on Apple silicon, or ``cpu``),
    ``worker_device`` (what torchrun workers compute on: ``cuda`` or ``cpu``, since no collective
    backend takes MPS tensors), ``backend`` (NCCL for CUDA workers, else gloo), ``nproc`` and
    ``why``, the sentence the notebook prints and records. One process per GPU; without GPUs,
    2 CPU processes. A lesson that needs ``min_ranks`` ranks (a rank to kill, DDP against one
    process, two pipeline stages) runs them as CPU processes with gloo when fewer GPUs are
    visible, because one GPU holds one NCCL rank (NCCL refuses two ranks on one device).
    ``max_ranks`` caps the count, e.g. a 2-stage pipeline on an 8-GPU machine.
    """
    if min_ranks < 1 or (max_ranks is not None and max_ranks < min_ranks):
        raise ValueError(f"need 1 <= min_ranks <= max_ranks, got {min_ranks} and {max_ranks}")
    gpus = gpu_info() if gpus is None else gpus
    cap = max_ranks or max(gpus.count, min_ranks, 2)
    if gpus.count >= min_ranks:
        n = min(gpus.count, cap)
        why = _("{processes}, one per GPU ({visible} visible), with NCCL").format(
            processes=_processes(n), visible=gpus.count
        )
        return {
            "device": "cuda",
            "worker_device": "cuda",
            "backend": "nccl",
            "nproc": n,
            "why": why,
        }
    return _cpu_plan(gpus, min_ranks, n=max(min_ranks, min(2, cap)))


def _processes(n: int, cpu: bool = False) -> str:
    """ "2 CPU processes", in the reader's language (one template each: no plural rules)."""
    if cpu:
        return (_("{n} CPU process") if n == 1 else _("{n} CPU processes")).format(n=n)
    return (_("{n} process") if n == 1 else _("{n} processes")).format(n=n)


def _cpu_plan(gpus: GPUInfo, min_ranks: int, n: int) -> dict[str, Any]:
    """gloo on ``n`` CPU processes, with the reason: no GPU, or fewer GPUs than ranks needed."""
    if gpus.count:
        why = _(
            "this lesson needs {need} ranks and only {visible} GPU(s) are visible; "
            "one GPU holds one NCCL rank, so it runs {processes} with gloo"
        ).format(need=min_ranks, visible=gpus.count, processes=_processes(n, cpu=True))
    else:
        why = _("no NVIDIA GPU visible, so {processes} with gloo").format(
            processes=_processes(n, cpu=True)
        )
    single = gpus.mps and not gpus.count and min_ranks == 1
    if single:
        why += _(" (Apple MPS serves single-process work; gloo cannot move MPS tensors)")
    return {
        "device": "mps" if single else "cpu",
        "worker_device": "cpu",
        "backend": "gloo",
        "nproc": n,
        "why": why,
    }


def hardware_summary(gpus: GPUInfo | None = None) -> dict[str, Any]:
    """The hardware block of metrics.json: what a regression report must match before comparing."""
    gpus = gpu_info() if gpus is None else gpus
    import torch

    return {
        **device_plan(gpus),
        "gpu_count": gpus.count,
        "gpu_names": [g.name for g in gpus.gpus],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device_notes": gpus.notes,
        "driver": gpus.driver,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _gpu_checks(gpus: GPUInfo, facts: dict[str, Any]) -> list[Check]:
    if not gpus.count:
        why = "; ".join(gpus.notes) or gpus.error
        return [
            Check(
                "gpus",
                WARN,
                _("no NVIDIA GPU visible ({error})").format(error=why),
                _("Fine for learning: lessons run on CPU with gloo and 2 processes."),
            )
        ]
    names = ", ".join(
        f"{name} {g.memory_used_bytes >> 20}/{g.memory_total_bytes >> 20} MiB"
        for name, g in zip(cuda_names(gpus), gpus.gpus, strict=True)
    )
    checks = [Check("gpus", PASS, f"{gpus.count} via {gpus.source}, driver {gpus.driver}: {names}")]
    checks += [
        Check("visible_devices", WARN, note, _("Notebook 00 explains CUDA_VISIBLE_DEVICES."))
        for note in gpus.notes
    ]
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
