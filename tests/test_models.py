"""helpers.models: the model takes MNIST-shaped batches, and its size is counted honestly."""

from __future__ import annotations

import torch

from helpers.models import SimpleCNN, count_parameters, parameter_bytes


def test_forward_shape() -> None:
    torch.manual_seed(0)
    assert SimpleCNN()(torch.randn(3, 1, 28, 28)).shape == (3, 10)


def test_parameter_counts() -> None:
    model = SimpleCNN()
    numel = sum(p.numel() for p in model.parameters())
    assert count_parameters(model) == numel > 0
    assert parameter_bytes(model) == 4 * numel  # float32
    assert parameter_bytes(model.to(torch.bfloat16)) == 2 * numel


def test_known_sizes() -> None:
    """Pinned so a silent architecture change shows up (and the notebooks' prose stays true)."""
    assert count_parameters(SimpleCNN()) == 421_642


def test_trainable_only_and_dropout() -> None:
    model = SimpleCNN(dropout=0.5)
    assert any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert not any(isinstance(m, torch.nn.Dropout) for m in SimpleCNN().modules())
    for p in model.features.parameters():
        p.requires_grad_(False)
    frozen = sum(p.numel() for p in model.features.parameters())
    assert count_parameters(model, trainable_only=True) == count_parameters(model) - frozen
