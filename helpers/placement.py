"""Where the stages of a manually split model go: one GPU per stage, or all on CPU, said plainly.

Model parallelism only means something with one device per stage. When there are not enough
GPUs the lesson still runs, with every stage on the CPU (the same code, no speed or memory gain),
and ``reason`` is the sentence the notebook prints and records as a skip. The GPU count comes
from NVML / ``nvidia-smi`` (``helpers.env.gpu_info``), so asking never initialises CUDA in the
notebook kernel; building a ``torch.device("cuda", i)`` does not initialise it either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.env import GPUInfo, cuda_names, gpu_info


@dataclass(frozen=True)
class StagePlacement:
    """The device of each stage, and whether the stages really sit on different devices."""

    devices: list[torch.device]
    separate: bool  # True: one GPU per stage, so the split divides memory and can overlap work
    reason: str  # one sentence for the reader (and for rec.skip when ``separate`` is False)


def stage_devices(n_stages: int, gpus: GPUInfo | None = None) -> StagePlacement:
    """``cuda:0 … cuda:n-1`` when at least ``n_stages`` GPUs are visible, else CPU for every stage.

    With fewer GPUs than stages the answer is CPU rather than "several stages on one GPU": the
    lesson is the split, and sharing one GPU would look like model parallelism without being it.
    """
    if n_stages < 1:
        raise ValueError(f"n_stages must be at least 1, got {n_stages}")
    gpus = gpu_info() if gpus is None else gpus
    if gpus.count >= n_stages:
        names = ", ".join(cuda_names(gpus)[:n_stages])
        return StagePlacement(
            [torch.device("cuda", i) for i in range(n_stages)],
            True,
            f"{n_stages} stages on {n_stages} GPUs: {names}",
        )
    found = "no GPU" if gpus.count == 0 else f"only {gpus.count} GPU(s)"
    return StagePlacement(
        [torch.device("cpu")] * n_stages,
        False,
        f"{n_stages} stages need {n_stages} GPUs and this machine has {found}, so every stage "
        f"runs on the CPU: the code and the maths are those of the real split, the memory "
        f"saving and the overlap are not",
    )
