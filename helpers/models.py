"""The two models the lessons train: a tiny CNN for correctness, a ResNet for speed.

``SimpleCNN`` is the guide's simple CNN with its shapes fixed for 1x28x28 MNIST. It has no
dropout and no batch norm by default, so one process on the global batch and DDP on shards
compute the same maths, which the DDP lessons check (up to float rounding).

``small_resnet`` is the ResNet-18 layout (four stages of two torchvision ``BasicBlock``s) with a
3x3 stride-1 stem, one input channel and no max-pool, so 28x28 digits are not shrunk to nothing.
``width=64`` has exactly the layers of torchvision's resnet18 adapted that way (11.2 M
parameters; module names differ): heavy enough for GPU, AMP and multi-GPU speed-ups to show.
On 2 CPU cores that trains at only about 40-50 images/s, so the default ``width=16``
(0.7 M parameters, same depth, same code path) keeps CPU and quick runs within minutes;
notebooks pass ``width=64`` on GPUs.
"""

from __future__ import annotations

import torch
from torch import nn


class SimpleCNN(nn.Module):
    """conv-relu-pool twice, then two linear layers: 28 -> 14 -> 7, so 64*7*7 features."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.0):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128),
            nn.ReLU(),
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _stage(in_ch: int, out_ch: int, stride: int) -> nn.Sequential:
    """Two BasicBlocks; the first changes width and resolution via a 1x1 shortcut, as resnet18."""
    from torchvision.models.resnet import BasicBlock  # here: SimpleCNN users skip torchvision

    shortcut = None
    if stride != 1 or in_ch != out_ch:
        shortcut = nn.Sequential(
            nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
        )
    return nn.Sequential(BasicBlock(in_ch, out_ch, stride, shortcut), BasicBlock(out_ch, out_ch))


def small_resnet(num_classes: int = 10, width: int = 16) -> nn.Module:
    """ResNet-18 for 1x28x28 inputs; ``width=64`` is torchvision's resnet18 (see module doc)."""
    w = width
    model = nn.Sequential(
        nn.Conv2d(1, w, kernel_size=3, stride=1, padding=1, bias=False),
        nn.BatchNorm2d(w),
        nn.ReLU(inplace=True),  # no max-pool: 28x28 is small already
        _stage(w, w, 1),
        _stage(w, 2 * w, 2),
        _stage(2 * w, 4 * w, 2),
        _stage(4 * w, 8 * w, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8 * w, num_classes),
    )
    for m in model.modules():  # torchvision's initialisation, so width=64 trains like resnet18
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """How many numbers the optimizer updates: what DDP all-reduces and FSDP shards."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes the weights occupy (dtype-aware); gradients and Adam state come in multiples of it."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
