"""helpers.models: the CNN takes MNIST batches, the GPT is causal, the MoE routes as it says."""

from __future__ import annotations

import pytest
import torch

from helpers.models import GPT, MoE, SimpleCNN, count_parameters, parameter_bytes, rotate


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


def test_the_gpt_scores_every_position_and_never_looks_ahead() -> None:
    torch.manual_seed(0)
    model = GPT(vocab=30, width=32, heads=4, layers=2)
    ids = torch.randint(0, 30, (2, 12))
    logits = model(ids)
    assert logits.shape == (2, 12, 30)
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 30  # the future changes ...
    assert torch.allclose(model(changed)[:, :8], logits[:, :8], atol=1e-6)  # ... the past does not
    assert not torch.allclose(model(changed)[:, 8:], logits[:, 8:])


def test_the_gpt_of_the_lessons_has_a_few_hundred_thousand_parameters() -> None:
    """Pinned: notebook 09 trains it in seconds on a CPU; a silent size change shows up here."""
    assert count_parameters(GPT(vocab=103)) == 211_648


def test_heads_must_divide_the_width() -> None:
    with pytest.raises(ValueError, match="width=30 must divide by heads=4"):
        GPT(vocab=10, width=30, heads=4)


def test_rope_makes_scores_depend_on_the_distance_only() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)

    def score(i: int, j: int) -> float:
        qi = rotate(q[None, :], torch.tensor([i]))[0]
        kj = rotate(k[None, :], torch.tensor([j]))[0]
        return float(qi @ kj)

    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-5)  # both 2 apart
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    assert torch.equal(rotate(q[None, :], torch.tensor([0])), q[None, :])  # position 0: as is


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_moe_sums_its_chosen_experts_weighted_by_the_router(top_k: int) -> None:
    torch.manual_seed(0)
    moe = MoE(width=8, hidden=16, experts=4, top_k=top_k)
    x = torch.randn(3, 5, 8)
    tokens = x.reshape(-1, 8)
    probabilities = torch.softmax(tokens @ moe.router.weight.T, dim=-1)
    expected = torch.stack(
        [
            sum(
                probabilities[n, e] * moe.experts[e](tokens[n])
                for e in probabilities[n].topk(top_k).indices
            )
            for n in range(len(tokens))
        ]
    )
    assert torch.allclose(moe(x).reshape(-1, 8), expected, atol=1e-6)


def test_the_moe_refuses_more_chosen_experts_than_it_has() -> None:
    with pytest.raises(ValueError, match="top_k=3 must be between 1 and experts=2"):
        MoE(width=4, hidden=8, experts=2, top_k=3)
