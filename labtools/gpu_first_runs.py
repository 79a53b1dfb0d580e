"""What has never run on a GPU, run first by ``make gpu-check``: the lessons' own scripts at
the machine's world size, on NCCL, each with what must hold and the verdict in one line.

The CPU suite proves every lesson on 2 gloo processes (and the scale lane at 1, 3, 4 and a
simulated 8). These are the paths only GPUs reach: tensor parallel and the bytes per step at
every GPU of the node, the CUDA allocator's activations, FSDP2 and the 2-D mesh for a full
run's steps, torch's ``context_parallel`` on CUDA kernels, and one process per GPU for a
DataLoader job (``nvidia-smi --query-compute-apps`` sampled while it runs). Each runs from the
script its lesson's cell writes (``labtools.exported_scripts.lesson_folders``), through the
kit's launcher, and says ``held``, ``did not hold`` or ``not run`` with the reason.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import arithmetic, launch
from labtools import exported_scripts

TOL = 1e-5  # the lessons' bound for another summation order
Outputs = dict[int, dict[str, Any]]


@dataclass(frozen=True)
class FirstRun:
    """A lesson's script on this machine's GPUs, and how to read its outputs."""

    what: str  # the row of RESULTS.md
    lesson: str
    script: str
    args: tuple[str, ...]
    least_gpus: int  # fewer: not run, and the reason says so
    verdict: Callable[[Outputs, int], str]  # (outputs, world) -> "held: ..." / "did not hold: ..."
    one_process: bool = False  # one process whatever the GPU count
    watch_gpus: bool = False  # sample nvidia-smi's compute apps while it runs


def _held(ok: bool, text: str) -> str:
    return ("held: " if ok else "did not hold: ") + text


def _tp_gpt(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    worst = max(
        max(r["max_diff_logits"], r["max_diff_after_step"]) for r in (out["tp"], out["tp_sp"])
    )
    counts = out["tp"]["per_block"] == {"all_reduce": 2}
    text = f"TP, TP+SP on {world} GPUs, mesh {out['mesh']}: max |split - dense| {worst:.1e}"
    return _held(
        worst <= TOL and counts, text + f", collectives per block {out['tp']['per_block']}"
    )


GPT = (96, 64, 2, 8, 64)  # notebook 12's GPT: vocab, width, layers, batch, seq


def gpt_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of notebook 12's GPT (4 heads), for its byte formulas."""
    import torch

    from helpers.models import GPT as Model

    torch.manual_seed(0)
    return [tuple(p.shape) for p in Model(GPT[0], GPT[1], 4, GPT[2]).parameters()]


def comm_bytes_differ(out: dict[str, Any], world: int) -> list[str]:
    """What of comm_bytes.py's counts differs from notebook 12's formulas at ``world``: DDP,
    ZeRO-2 and ZeRO-3 per step, and the TP block's forward and backward under Megatron's plan
    (absent where no degree fits). One rank hands its collectives nothing to move, so world 1
    compares the TP part only."""
    wrong = []
    for stage in ("ddp", "zero2", "zero3") if world > 1 else ():
        measured: dict[str, int] = {}
        for kind, size in out[stage]:
            measured[kind] = measured.get(kind, 0) + size
        predicted = arithmetic.comm_bytes_per_step(gpt_shapes(), world, stage)
        wrong += [stage] if measured != {k: v for k, v in predicted.items() if v} else []
    if out["tp_block"] is not None:
        predicted = arithmetic.tp_bytes_per_block(*GPT[3:], GPT[1], plan="megatron")
        handed = {way: sum(size for _, size in out["tp_block"][way]) for way in predicted}
        wrong += ["tp"] if handed != predicted else []
    return wrong


def _comm_bytes(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    wrong = comm_bytes_differ(out, world)
    tp = (
        "no TP degree fits"
        if out["tp_block"] is None
        else f"TP block over tp {out['tp_block']['tp']}"
    )
    but = f" except {wrong}" if wrong else ""
    return _held(not wrong, f"{world} NCCL ranks: DDP, ZeRO-2/3, TP bytes = formulas{but}; {tp}")


def _activation_memory(outputs: Outputs, world: int) -> str:
    """activation_memory.py's fp32 case by the CUDA allocator against the formula (the token
    ids existed before its baseline), and the CUDA context it names."""
    out = outputs[0]["fp32"]["allocator"]
    model = arithmetic.Transformer(96, 256, 4, 4)
    predicted = arithmetic.transformer_activation_bytes(model, 8, 256) - 8 * 8 * 256
    error = abs(out["forward"] - predicted) / predicted
    context = out.get("context")
    extra = f", context {context / 2**20:.0f} MiB" if context is not None else ""
    peak = out["backward peak"] / 2**20
    text = f"activations {error:.1%} from the formula (bound 10 %), backward peak {peak:.1f} MiB"
    return _held(error <= 0.10, text + extra)


def _shard_equal(outputs: Outputs, world: int) -> str:
    diff = outputs[0]["max_param_diff"]
    return _held(
        diff <= TOL, f"FSDP2 on {world} GPUs vs one process after the full run: {diff:.1e}"
    )


def _tp_2d(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    diff = max(abs(a - b) for a, b in zip(out["losses"], out["reference_losses"], strict=True))
    return _held(
        diff <= TOL, f"2-D mesh {out['mesh']}, full run: max |loss - one process| {diff:.1e}"
    )


def _torch_cp(outputs: Outputs, world: int) -> str:
    out = outputs[0]
    if "max_diff" not in out:
        return f"did not hold: {out.get('error')}"
    return _held(
        out["max_diff"] <= TOL,
        f"{world} rank(s): max |context_parallel - full| {out['max_diff']:.1e}",
    )


def _one_process_per_gpu(
    outputs: Outputs, world: int, seen: dict[int, set[str]] | None = None
) -> str:
    seen = seen or {}
    if not seen:
        return "did not hold: nvidia-smi listed none of the workers while the job ran"
    crowded = {pid: gpus for pid, gpus in seen.items() if len(gpus) > 1}
    per_gpu: dict[str, int] = {}
    for gpus in seen.values():
        for gpu in gpus:
            per_gpu[gpu] = per_gpu.get(gpu, 0) + 1
    ok = not crowded and all(n == 1 for n in per_gpu.values()) and len(per_gpu) == world
    return _held(
        ok, f"{len(seen)} workers on {len(per_gpu)} GPU(s), {dict(sorted(per_gpu.items()))} per GPU"
    )


FIRST_RUNS = [
    FirstRun(
        "09 §3: TP and TP+SP on the GPT, every GPU (NCCL)",
        "09_tensor_parallel",
        "tp_gpt.py",
        (),
        2,
        _tp_gpt,
    ),
    FirstRun(
        "12 §2: bytes per collective, every GPU (NCCL)",
        "12_arithmetic_of_parallelism",
        "comm_bytes.py",
        tuple(map(str, GPT)),
        2,
        _comm_bytes,
    ),
    FirstRun(
        "12 §3: activations by the CUDA allocator",
        "12_arithmetic_of_parallelism",
        "activation_memory.py",
        ("96", "256", "4", "4", "8", "256"),
        1,
        _activation_memory,
        one_process=True,
    ),
    FirstRun(
        "08 §2 full mode: FSDP2 = one process (NCCL)",
        "08_fully_sharded_data_parallel",
        "shard_equal.py",
        ("300", "64", "1e-3", "{out}/fsdp_nccl.pt"),
        2,
        _shard_equal,
    ),
    FirstRun(
        "09 §4 full mode: 2-D mesh = one process (NCCL)",
        "09_tensor_parallel",
        "tp_2d.py",
        ("200", "16", "3e-3"),
        4,
        _tp_2d,
    ),
    FirstRun(
        "11: torch's context_parallel on CUDA",
        "11_context_and_expert_parallel",
        "torch_cp.py",
        ("4096",),
        1,
        _torch_cp,
    ),
    FirstRun(
        "04: one process per GPU (nvidia-smi --query-compute-apps)",
        "04_dataloader_tuning",
        "loader_ddp.py",
        ("--workers", "1", "--steps", "60"),
        1,
        _one_process_per_gpu,
        watch_gpus=True,
    ),
]


def compute_apps() -> dict[int, set[str]]:
    """pid -> the GPUs (by index) nvidia-smi lists it on, now; {} when nvidia-smi says nothing."""

    def query(what: str) -> list[list[str]]:
        done = subprocess.run(
            ["nvidia-smi", f"--query-{what}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [
            [f.strip() for f in line.split(",")]
            for line in done.stdout.splitlines()
            if line.strip()
        ]

    try:
        index = {uuid: i for i, uuid in query("gpu=index,uuid")}
        apps: dict[int, set[str]] = {}
        for pid, uuid in query("compute-apps=pid,gpu_uuid"):
            apps.setdefault(int(pid), set()).add(index.get(uuid, uuid))
        return apps
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def _run(first: FirstRun, work: Path, gpus: int, out_dir: Path, timeout: float) -> str:
    world = 1 if first.one_process else gpus
    args = [a.replace("{out}", str(out_dir)) for a in first.args]
    job = launch.Job(
        work / first.script, args, nproc=world, device="cuda", out_dir=out_dir, max_lines=0
    )
    seen: dict[int, set[str]] = {}
    stop = threading.Event()

    def watch() -> None:  # which GPUs each worker holds, while it runs
        while not stop.wait(0.5):
            workers = set(job.worker_pids())
            for pid, on in compute_apps().items():
                if pid in workers:
                    seen.setdefault(pid, set()).update(on)

    watcher = threading.Thread(target=watch, daemon=True) if first.watch_gpus else None
    if watcher:
        watcher.start()
    try:
        result = job.wait(timeout)
    finally:
        stop.set()
    outputs = {int(r): v for r, v in result.outputs.items()}
    if first.watch_gpus:
        return _one_process_per_gpu(outputs, world, seen)
    return first.verdict(outputs, world)


def run_all(run_dir: Path, gpus: int, deadline: float) -> dict[str, str]:
    """Every first run that this machine and the time left allow: row -> verdict."""
    folders = exported_scripts.lesson_folders(run_dir / "first_runs")
    verdicts = {}
    for first in FIRST_RUNS:
        left = deadline - time.monotonic()
        if gpus < first.least_gpus:
            verdicts[first.what] = (
                f"not run: needs {first.least_gpus} GPUs, this machine has {gpus}"
            )
        elif left < 30:
            verdicts[first.what] = "not run: the gpu-check budget was spent"
        else:
            print(f"-> first run: {first.what} ...", flush=True)
            out_dir = run_dir / "first_runs" / "jobs" / Path(first.script).stem
            try:
                verdicts[first.what] = _run(first, folders[first.lesson], gpus, out_dir, left)
            except launch.LaunchError as exc:
                verdicts[first.what] = f"did not hold: {str(exc).splitlines()[0]}"
            print(f"   {verdicts[first.what]}", flush=True)
    return verdicts
