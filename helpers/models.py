"""The model the lessons train, and what it weighs: parameters and bytes.

``SimpleCNN`` is a two-convolution CNN with its shapes fixed for 1x28x28 MNIST. It has no
dropout and no batch norm by default, so one process on the global batch and DDP on shards
compute the same maths, which the DDP lessons check (up to float rounding).
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


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """How many numbers the optimizer updates: what DDP all-reduces and FSDP shards."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes the weights occupy (dtype-aware); gradients and Adam state come in multiples of it."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
