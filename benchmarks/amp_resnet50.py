"""Benchmark: ResNet-50 training on one CUDA GPU in fp32, TF32, bf16 and fp16 AMP, side by side.

NVIDIA's published ResNet-50 v1.5 training figures for one GPU (DeepLearningExamples, "ResNet50
v1.5 For PyTorch", training performance results, pytorch-21.03 NGC container,
https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/README.md):
A100 80GB, TF32 938 -> mixed precision 2470 images/s (2.63x); V100 16GB, FP32 367 -> 1200
images/s (3.26x); no memory figure is published there. This script measures the same
comparison on the GPU in front of you: the same model, optimizer and synthetic ImageNet-sized
batch (3x224x224, 1000 classes) in each mode, median step time after warm-up with the GPU
synchronised, peak memory from
``torch.cuda.max_memory_allocated``, and every figure as a ratio to fp32 from the same run.
The data are synthetic and already on the GPU, so it measures the model, not the input pipeline.

``fp32`` is IEEE fp32 (TF32 off for matmuls and cuDNN convolutions); ``tf32`` lets Ampere and
newer GPUs round fp32 matmul/conv inputs to TF32 on Tensor Cores; ``bf16`` and ``fp16`` are
``torch.autocast`` (fp16 with ``torch.amp.GradScaler``). The goal on a modern GPU: AMP at
least 2.5x the fp32 images/s with at most 0.6x its peak memory.

    .venv/bin/python benchmarks/amp_resnet50.py                      # all modes, batch 64
    .venv/bin/python benchmarks/amp_resnet50.py --batch-size 128 --json results.json

It needs a CUDA GPU: on CPU (or Apple MPS) it refuses with a message and exit code 2, since
Tensor Cores are the point; notebook 03 measures mixed precision on a CPU instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MODES = ("fp32", "tf32", "bf16", "fp16")
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
GOAL_SPEEDUP = 2.5  # AMP images/s over fp32, at least
GOAL_MEMORY = 0.6  # AMP peak memory over fp32, at most
PUBLISHED = (  # NVIDIA DeepLearningExamples, ResNet50 v1.5 For PyTorch (module docstring)
    "published, ResNet-50 v1.5 on 1 GPU (NVIDIA DeepLearningExamples): A100 80GB TF32 938 -> "
    "mixed precision 2470 images/s (2.63x); V100 16GB FP32 367 -> 1200 images/s (3.26x)"
)
EXIT_NO_CUDA = 2


def why_not_runnable() -> str | None:
    """The reason this machine cannot run the benchmark, or None when a CUDA GPU is usable."""
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build. Install a CUDA build of torch "
            f"(https://pytorch.org/get-started/) on a machine with an NVIDIA GPU."
        )
    if not torch.cuda.is_available():
        return (
            f"no CUDA GPU is usable here (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}, torch.cuda.is_available() is False). Run it on a "
            f"machine with an NVIDIA GPU; check the driver with nvidia-smi."
        )
    return None


def set_tf32(enabled: bool) -> None:
    """TF32 on or off for both cuBLAS matmuls and cuDNN convolutions.

    torch >= 2.9 has the ``fp32_precision`` settings; the older ``allow_tf32`` flags are on
    their way out and mixing the two APIs raises when read back, so use one or the other.
    """
    precision = "tf32" if enabled else "ieee"
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
    else:  # torch < 2.9
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_mode(
    mode: str,
    *,
    device: torch.device,
    batch_size: int = 64,
    steps: int = 30,
    warmup: int = 10,
    image_size: int = 224,
    num_classes: int = 1000,
    channels_last: bool = True,
    model_fn: Callable[..., nn.Module] | None = None,
) -> dict[str, Any]:
    """Train ``steps`` timed steps (after ``warmup``) in one mode; images/s, peak memory, loss.

    ``model_fn(num_classes=...)`` builds the model (torchvision's resnet50 by default; the tests
    pass a tiny one to check this logic on CPU, where peak memory is reported as None).
    """
    if model_fn is None:
        from torchvision.models import resnet50 as model_fn
    if device.type == "cuda":
        set_tf32(mode == "tf32")  # "fp32" means IEEE fp32 everywhere
    dtype = AMP_DTYPES.get(mode)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = model_fn(num_classes=num_classes).to(device, memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")
    x = torch.randn(batch_size, 3, image_size, image_size, device=device)
    x = x.contiguous(memory_format=memory_format)
    y = torch.randint(0, num_classes, (batch_size,), device=device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    seconds = []
    for step in range(warmup + steps):
        synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if step >= warmup:  # warm-up pays for cuDNN autotuning and allocator growth
            seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    median = statistics.median(seconds)
    result = {
        "mode": mode,
        "images_per_s": batch_size / median,
        "median_step_s": median,
        "peak_memory_bytes": peak,
        "final_loss": loss.item(),
        "steps": steps,
        "batch_size": batch_size,
    }
    del model, optimizer, x, y, loss
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def add_ratios(results: list[dict[str, Any]], base: str = "fp32") -> list[dict[str, Any]]:
    """Speed-up and memory ratio of every mode against ``base``, measured in the same run."""
    ref = next((r for r in results if r["mode"] == base), results[0])
    for r in results:
        r["speedup"] = r["images_per_s"] / ref["images_per_s"]
        both = r["peak_memory_bytes"] is not None and ref["peak_memory_bytes"]
        r["memory_ratio"] = r["peak_memory_bytes"] / ref["peak_memory_bytes"] if both else None
    return results


def goal_report(results: list[dict[str, Any]]) -> tuple[str, bool]:
    """One line per AMP mode saying whether it met the speed and memory goals against fp32."""
    lines, met_any = [], False
    for r in results:
        if r["mode"] not in AMP_DTYPES:
            continue
        fast = r["speedup"] >= GOAL_SPEEDUP
        small = r["memory_ratio"] is not None and r["memory_ratio"] <= GOAL_MEMORY
        met_any |= fast and small
        memory = "n/a" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}x"
        lines.append(
            f"{r['mode']}: {r['speedup']:.2f}x images/s "
            f"({'meets' if fast else 'misses'} >= {GOAL_SPEEDUP}x), {memory} memory "
            f"({'meets' if small else 'misses'} <= {GOAL_MEMORY}x)"
        )
    return "\n".join(lines), met_any


def format_table(results: list[dict[str, Any]]) -> str:
    """The side-by-side table: images/s and peak memory, each with its ratio to fp32."""
    lines = [
        f"{'mode':5}  {'images/s':>9}  {'vs fp32':>7}  {'peak GiB':>8}  {'vs fp32':>7}  {'loss':>6}"
    ]
    for r in results:
        peak = r["peak_memory_bytes"]
        peak_s = "n/a" if peak is None else f"{peak / 2**30:.2f}"
        ratio_s = "n/a" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}x"
        lines.append(
            f"{r['mode']:5}  {r['images_per_s']:9.1f}  {r['speedup']:6.2f}x  "
            f"{peak_s:>8}  {ratio_s:>7}  {r['final_loss']:6.3f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per mode first")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--no-channels-last",
        action="store_true",
        help="keep NCHW (channels_last is what Tensor Core convolutions want)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    reason = why_not_runnable()
    if reason:
        print(
            f"amp_resnet50.py measures Tensor Cores and needs a CUDA GPU: {reason}\n"
            f"On CPU, notebook 03 measures mixed precision on a small CNN instead.",
            file=sys.stderr,
        )
        return EXIT_NO_CUDA

    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest kernels
    name = torch.cuda.get_device_name(device)
    major, minor = torch.cuda.get_device_capability(device)
    modes = list(args.modes)
    if "fp32" not in modes:
        modes.insert(0, "fp32")  # every ratio is against fp32 measured in this run
    notes = []
    if "bf16" in modes and not torch.cuda.is_bf16_supported(including_emulation=False):
        modes.remove("bf16")
        notes.append(
            f"bf16 skipped: {name} (sm_{major}{minor}) has no native bf16; "
            f"it needs Ampere (sm_80) or newer"
        )
    if "tf32" in modes and major < 8:
        notes.append(f"tf32 equals fp32 on {name} (sm_{major}{minor}): TF32 needs sm_80+")
    print(
        f"{name} (sm_{major}{minor}), torch {torch.__version__}, batch {args.batch_size}, "
        f"{args.warmup} warm-up + {args.steps} timed steps per mode, "
        f"{'NCHW' if args.no_channels_last else 'channels_last'}, synthetic 3x224x224 input",
        flush=True,
    )
    results = []
    for mode in modes:
        results.append(
            bench_mode(
                mode,
                device=device,
                batch_size=args.batch_size,
                steps=args.steps,
                warmup=args.warmup,
                channels_last=not args.no_channels_last,
            )
        )
        print(f"  {mode}: {results[-1]['images_per_s']:.1f} images/s", flush=True)
    set_tf32(False)
    add_ratios(results)
    report, met = goal_report(results)
    print("\n" + format_table(results))
    print(
        f"\ngoal: AMP >= {GOAL_SPEEDUP}x fp32 images/s and <= {GOAL_MEMORY}x its peak memory"
        f"\n{report}\n{PUBLISHED}\ngoal met by at least one AMP mode: {met}"
    )
    for note in notes:
        print(f"note: {note}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "gpu": name,
                    "capability": f"{major}.{minor}",
                    "torch": torch.__version__,
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": results,
                    "goal_met": met,
                    "notes": notes,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
