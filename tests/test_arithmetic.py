"""helpers.arithmetic: the formulas notebook 12 prints next to measurements, checked here against
PyTorch itself where that is cheap (parameter counts, saved activations) and against hand sums."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import arithmetic
from helpers.models import GPT, SimpleCNN, count_parameters


def saved_bytes(model: GPT, ids: torch.Tensor) -> int:
    """What autograd saves for one next-token loss, weights left out (as notebook 12 counts)."""
    with arithmetic.SavedBytes(model) as saved:
        F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    return saved.bytes


def test_bytes_per_parameter_with_adam_is_16_in_both_precisions():
    for precision in ("fp32", "bf16"):
        assert sum(arithmetic.bytes_per_parameter(precision).values()) == 16
    assert arithmetic.bytes_per_parameter("bf16")["master"] == 4
    with pytest.raises(ValueError):
        arithmetic.bytes_per_parameter("fp8")


@pytest.mark.parametrize("vocab,width,layers", [(50, 32, 1), (96, 64, 3)])
def test_gpt_parameters_counts_the_kits_gpt(vocab, width, layers):
    assert arithmetic.gpt_parameters(vocab, width, layers) == count_parameters(
        GPT(vocab, width, 4, layers)
    )


def test_activation_formula_equals_the_bytes_autograd_saves():
    torch.manual_seed(0)
    model = GPT(40, 32, 2, 2)
    ids = torch.randint(40, (2, 24))
    assert saved_bytes(model, ids) == arithmetic.gpt_activation_bytes(2, 24, 32, 2, 2, 40)


def test_checkpointing_keeps_one_vector_per_token_and_block():
    full = arithmetic.gpt_activation_bytes(4, 64, 64, 4, 4, 96)
    ckpt = arithmetic.gpt_activation_bytes(4, 64, 64, 4, 4, 96, checkpoint=True)
    more = arithmetic.gpt_activation_bytes(4, 64, 64, 5, 4, 96, checkpoint=True)
    assert ckpt < full / 5
    assert more - ckpt == 4 * 64 * 64 * 4  # one block input, fp32


def test_sharded_numel_pads_dim0_to_a_multiple_of_the_ranks():
    assert arithmetic.sharded_numel([(10, 3)], 4) == 3 * 3  # ceil(10 / 4) rows of 3
    assert arithmetic.sharded_numel([(8,)], 4) == 2


def test_zero_stages_shard_optimizer_then_grads_then_weights():
    shapes = [(64, 64)] * 8
    numel = 8 * 64 * 64
    by_stage = [arithmetic.state_bytes_per_rank(shapes, 4, s) for s in range(4)]
    assert by_stage[0] == {"params": 4 * numel, "grads": 4 * numel, "optimizer": 8 * numel}
    assert by_stage[1]["optimizer"] == 8 * numel // 4  # 8 equal tensors: 2 per rank
    assert by_stage[2]["grads"] == 4 * numel // 4 and by_stage[2]["params"] == 4 * numel
    assert by_stage[3] == {k: v // 4 for k, v in by_stage[0].items()}


def test_zero1_partition_is_greedy_largest_first():
    assert arithmetic.zero1_partition([10, 1, 1, 1], 2) == [10, 3]
    assert sum(arithmetic.zero1_partition([5, 4, 3, 2, 1], 3)) == 15


def test_comm_bytes_ddp_one_psi_zero3_three_zero2_two():
    shapes = [(64, 64), (64,)]
    psi = 4 * (64 * 64 + 64)
    assert arithmetic.comm_bytes_per_step(shapes, 2, "ddp") == {"all_reduce": psi}
    zero3 = arithmetic.comm_bytes_per_step(shapes, 2, "zero3")
    assert zero3 == {"all_gather": 2 * psi, "reduce_scatter": psi}
    assert arithmetic.comm_bytes_per_step(shapes, 2, "zero2")["all_gather"] == psi
    kept = arithmetic.comm_bytes_per_step(shapes, 2, "zero3", root=[(64,)])
    assert kept["all_gather"] == 2 * psi - 4 * 64


def test_tp_bytes_scale_with_the_batch_not_the_weights():
    one, two = arithmetic.tp_bytes_per_block(1, 16, 32), arithmetic.tp_bytes_per_block(2, 16, 32)
    assert two == {k: 2 * v for k, v in one.items()}
    assert one["backward"] == 2 * one["forward"]


def test_busbw_factors_are_nccl_tests():
    assert arithmetic.busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert arithmetic.busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert arithmetic.busbw_factor("all_reduce", 1) == 0


def test_alpha_beta_fit_recovers_a_known_line():
    sizes = [2**i for i in range(10, 24, 2)]
    alpha, beta = 20e-6, 5e9
    fit = arithmetic.fit_alpha_beta(sizes, [alpha + s / beta for s in sizes])
    assert fit == pytest.approx((alpha, beta), rel=1e-6)
    assert arithmetic.predict_seconds(alpha, beta, [0, 0]) == pytest.approx(2 * alpha)


def test_flops_of_a_step_are_three_forwards():
    fwd = arithmetic.gpt_flops_per_step(2, 16, 32, 2, 50, backward=False)
    assert arithmetic.gpt_flops_per_step(2, 16, 32, 2, 50) == 3 * fwd
    assert fwd == 32 * (24 * 32**2 * 2 + 2 * 32 * 50 + 4 * 16 * 32 * 2)


def test_layout_params_per_rank_divides_to_the_whole_model():
    vocab, width, layers = 1000, 256, 4
    assert arithmetic.layout_params_per_rank(
        vocab, width, layers, 1, 1
    ) == arithmetic.gpt_parameters(vocab, width, layers)
    assert arithmetic.layout_params_per_rank(vocab, width, layers, 2, 4) < math.ceil(
        arithmetic.gpt_parameters(vocab, width, layers) / 4
    )


def test_estimate_fits_and_shrinks_with_zero_stage():
    v, w, layers, h = arithmetic.PRESETS["6.7B"]
    by_stage = [arithmetic.estimate(v, w, layers, h, 4096, 1, zero_stage=s) for s in range(4)]
    totals = [e["total"] for e in by_stage]
    assert totals == sorted(totals, reverse=True)
    assert not by_stage[0]["fits"] and by_stage[3]["fits"]
    assert by_stage[3]["sent_dp"] == pytest.approx(1.5 * by_stage[2]["sent_dp"])
    with pytest.raises(ValueError):
        arithmetic.estimate(v, w, layers, h, 4096, 1, tp=3, gpus=8)


@pytest.mark.parametrize("batch,dropout", [(1, 0.0), (3, 0.5)])
def test_cnn_activation_formula_equals_the_bytes_autograd_saves(batch, dropout):
    model = SimpleCNN(dropout=dropout)  # training mode: dropout keeps its mask
    with arithmetic.SavedBytes(model) as saved:
        F.cross_entropy(model(torch.randn(batch, 1, 28, 28)), torch.randint(10, (batch,)))
    assert saved.bytes == arithmetic.cnn_activation_bytes(batch, dropout > 0)


def test_saved_bytes_counts_a_shared_storage_once_and_leaves_weights_out():
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with arithmetic.SavedBytes(layer) as saved:
        y = layer(x)  # saves x (the weight is left out)
        (y * y).sum()  # saves y twice: one storage
    assert saved.bytes == x.nbytes + y.nbytes
