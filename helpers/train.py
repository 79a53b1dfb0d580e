"""A plain, seeded training loop and an honest throughput timer for the single-process lessons.

The multi-process lessons write their own loop in the script the notebook shows (that loop is
the lesson); this one is the reference they are compared with, so it stays short and readable.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from helpers.messages import _

Device = str | torch.device


def seed_everything(seed: int) -> None:
    """Seed every RNG a lesson touches, so a rerun (or another rank) draws the same numbers."""
    random.seed(seed)
    torch.manual_seed(seed)  # CPU and, lazily, every GPU: it does not initialise CUDA
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def exact_fp32() -> None:
    """IEEE fp32 on NVIDIA GPUs and no autotuned convolutions: what an equality proof needs.

    By default cuDNN convolutions may round their inputs to TF32 (a 10-bit mantissa) on Ampere
    and newer GPUs, and ``cudnn.benchmark`` may pick another algorithm for a batch of 64 than
    for one of 128. Both are right for training and wrong for a 1e-5 comparison of a DDP run
    with one process on the global batch, so the proof runs call this and speed runs do not.
    It only sets flags (CUDA is not initialised) and changes nothing on a CPU.
    """
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch >= 2.9
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:  # the older flags; the two APIs must not be mixed
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def synchronize(device: Device) -> None:
    """Wait for queued GPU work: without it a clock measures how fast kernels are *launched*."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


class Throughput:
    """Samples per second over the steps after ``warmup``, read from a synchronised clock.

    The first steps pay for allocator growth, cuDNN autotuning and worker start-up; counting them
    would make every comparison depend on how long the run was. Call ``step(batch_size)`` once at
    the end of each step. With ``warmup=0`` the clock starts when the timer is made.

    It also keeps the process's CPU time over the same steps (all its threads): unlike the wall
    clock, CPU seconds per sample barely change when other programs share the cores, so they say
    what a run costs even on a busy machine.
    """

    def __init__(self, device: Device, warmup: int = 5):
        self.device = device
        self.warmup = warmup
        self.steps = 0
        self.samples = 0  # counted after warm-up only
        self.step_seconds: list[float] = []
        self._last: float | None = self._now() if warmup == 0 else None
        self._start = self._last
        self._cpu_start = self._cpu_last = time.process_time()

    def _now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def step(self, batch_size: int) -> None:
        self.steps += 1
        if self.steps < self.warmup:
            return
        now = self._now()
        if self.steps == self.warmup:  # end of the last warm-up step: the clock starts here
            self._start = self._last = now
            self._cpu_start = time.process_time()
            return
        assert self._last is not None
        self.step_seconds.append(now - self._last)
        self.samples += batch_size
        self._last = now
        self._cpu_last = time.process_time()

    @property
    def seconds(self) -> float:
        """Measured time: from the end of warm-up to the last step."""
        if self._start is None or self._last is None:
            return 0.0
        return self._last - self._start

    @property
    def samples_per_s(self) -> float:
        """NaN until a step past warm-up was measured (recorded as null, never as a fake 0)."""
        return self.samples / self.seconds if self.seconds > 0 else math.nan

    @property
    def cpu_ms_per_sample(self) -> float:
        """CPU milliseconds this process (every thread) spent per measured sample; NaN before."""
        return (self._cpu_last - self._cpu_start) * 1e3 / self.samples if self.samples else math.nan

    @property
    def median_step_s(self) -> float:
        """The typical step, robust to the odd slow one (a GC pause, another user's job)."""
        return statistics.median(self.step_seconds) if self.step_seconds else math.nan


def _steps(loader: Iterable, max_steps: int | None) -> int | None:
    try:
        n = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return max_steps
    return n if max_steps is None else min(n, max_steps)


def train_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    device: Device,
    *,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    max_steps: int | None = None,
    progress: bool = True,
    desc: str = "train",
) -> dict[str, Any]:
    """One pass over ``loader``; returns mean loss, accuracy, samples/s and every step's loss.

    ``max_steps`` is what quick mode uses to stay within its time budget. Warm-up for the timer
    is a quarter of the steps, at most 5, so short runs still report a throughput.
    """
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    total = _steps(loader, max_steps)
    timer = Throughput(device, warmup=min(5, (total or 20) // 4))
    model.train()
    losses: list[float] = []
    correct = seen = 0
    # leave=True: the bar stays after the loop with its final rate, the last thing worth seeing
    bar = tqdm(loader, total=total, desc=desc, disable=not progress, leave=True, unit="batch")
    for step, (x, y) in enumerate(bar):
        if max_steps is not None and step >= max_steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        correct += (out.argmax(1) == y).sum().item()
        seen += len(y)
        timer.step(len(y))
        if step % 10 == 0 or step + 1 == total:  # the last update is the one the bar keeps
            bar.set_postfix(loss=f"{losses[-1]:.3f}", samples_per_s=f"{timer.samples_per_s:.0f}")
    bar.close()
    return {
        "loss": sum(losses) / max(len(losses), 1),
        "accuracy": correct / max(seen, 1),
        "samples_per_s": timer.samples_per_s,
        "losses": losses,
        "steps": len(losses),
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable, device: Device, max_steps: int | None = None
) -> dict[str, float]:
    """Mean loss and accuracy over the samples seen (not over batches: the last may be short)."""
    model.eval()
    loss_sum, correct, seen = 0.0, 0, 0
    for step, (x, y) in enumerate(loader):
        if max_steps is not None and step >= max_steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        out = model(x)
        loss_sum += nn.functional.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        seen += len(y)
    return {"loss": loss_sum / max(seen, 1), "accuracy": correct / max(seen, 1), "samples": seen}


def make_optimizer(model: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (the classic) or Adam; nothing else, so runs stay comparable."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {name!r}")


def fit(
    model: nn.Module,
    train_loader: Iterable,
    test_loader: Iterable,
    device: Device,
    epochs: int,
    lr: float,
    *,
    optimizer: str = "sgd",
    max_steps_per_epoch: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Train and test for ``epochs``; the per-epoch history is what the notebooks plot and record.

    Seeds first, so that with a seeded loader (``make_loader``) two calls give the same losses.
    """
    seed_everything(seed)
    model.to(device)
    opt = make_optimizer(model, optimizer, lr)
    keys = ("loss", "accuracy", "test_loss", "train_accuracy", "samples_per_s", "step_losses")
    history: dict[str, Any] = {k: [] for k in keys}
    start = time.perf_counter()
    for epoch in range(epochs):
        train = train_epoch(
            model,
            train_loader,
            opt,
            device,
            max_steps=max_steps_per_epoch,
            progress=progress,
            desc=f"epoch {epoch + 1}/{epochs}",
        )
        test = evaluate(model, test_loader, device)
        history["loss"].append(train["loss"])
        history["train_accuracy"].append(train["accuracy"])
        history["samples_per_s"].append(train["samples_per_s"])
        history["step_losses"].extend(train["losses"])
        history["accuracy"].append(test["accuracy"])
        history["test_loss"].append(test["loss"])
        if progress:
            line = _(
                "epoch {epoch}/{epochs}: train loss {loss:.4f}, test accuracy {accuracy:.4f}, "
                "{rate:.0f} samples/s"
            )
            print(
                line.format(
                    epoch=epoch + 1,
                    epochs=epochs,
                    loss=train["loss"],
                    accuracy=test["accuracy"],
                    rate=train["samples_per_s"],
                )
            )
    history["final_accuracy"] = history["accuracy"][-1] if epochs else math.nan
    history["seconds"] = time.perf_counter() - start
    return history
