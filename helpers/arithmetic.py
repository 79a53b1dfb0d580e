"""The arithmetic of parallelism: bytes held, bytes moved, seconds and FLOPs, as formulas.

Notebook 12 prints each of these next to a measurement of the same quantity, so a formula here
is only as good as that comparison. They count what PyTorch really allocates for the kit's
models (``helpers.models.GPT``): which tensors autograd keeps, how FSDP pads a shard, which
collective moves what. Numbers are bytes unless a name says otherwise; ``value_bytes`` is the
size of one element (4 for fp32, 2 for bf16).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

from helpers.messages import _

# Bytes each parameter costs with Adam. Mixed precision keeps bf16 weights and gradients for
# the maths, plus an fp32 master copy that the optimizer updates: 2 + 2 + 4 + 8 = 16, the same
# as fp32 (4 + 4 + 8). It saves activation memory and time, not the state's bytes.
BYTES_PER_PARAMETER = {
    "fp32": {"weights": 4, "grads": 4, "master": 0, "adam": 8},
    "bf16": {"weights": 2, "grads": 2, "master": 4, "adam": 8},
}


def bytes_per_parameter(precision: str = "fp32") -> dict[str, int]:
    """Weights, gradients, fp32 master copy and Adam's two moments, per parameter."""
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision {precision!r}: one of {sorted(BYTES_PER_PARAMETER)}")
    return dict(BYTES_PER_PARAMETER[precision])


def gpt_parameters(vocab: int, width: int, layers: int) -> int:
    """Parameters of ``helpers.models.GPT``: embedding and output ``vocab x width`` each; per
    block four ``width x width`` attention projections, an MLP ``width -> 4 width -> width``
    with biases, two RMSNorm weights; one final RMSNorm."""
    block = 4 * width**2 + (8 * width**2 + 5 * width) + 2 * width
    return 2 * vocab * width + layers * block + width


def gpt_activation_bytes(
    batch: int,
    seq: int,
    width: int,
    layers: int,
    heads: int,
    vocab: int,
    checkpoint: bool = False,
    value_bytes: int = 4,
) -> int:
    """Bytes autograd keeps between forward and backward for ``GPT`` (loss included).

    Per block and token, 19 vectors of ``width``: the block's input, the two norms' (input,
    normalised, scaled) outputs, rotated q and k, v, the attention output and its reshaped
    copy, the residual, and 4 + 4 for the MLP's widened pre- and post-GELU values. Plus two
    RMSNorm scales per token (fp32), the attention's log-sum-exp (``heads`` fp32 per token, as
    flash-style attention keeps; no ``seq x seq`` matrix) and RoPE's cos and sin (``2 seq
    width / heads``). After the blocks: the final norm's three vectors, the log-softmax over
    ``vocab`` and the int64 token ids. With activation checkpointing a block keeps only its
    input, and recomputes the rest during backward (one block's worth is alive again then).
    """
    tokens = batch * seq
    if checkpoint:
        per_block = tokens * width * value_bytes
    else:
        per_block = (
            19 * tokens * width * value_bytes
            + 2 * tokens * 4  # RMSNorm's 1/rms per token, fp32
            + batch * heads * seq * 4  # attention's log-sum-exp, fp32
            + 2 * seq * (width // heads) * value_bytes  # RoPE: cos, sin for q and for k
        )
    head = 3 * tokens * width * value_bytes + tokens * 4 + tokens * vocab * value_bytes
    return layers * per_block + head + tokens * 8 + 4  # + token ids (int64) + the loss


def cnn_activation_bytes(batch: int, dropout: bool = False) -> int:
    """Bytes autograd keeps between forward and backward for ``helpers.models.SimpleCNN`` on
    28 x 28 images (loss included). Per image: the input (the first convolution's); each ReLU's
    output, which its max-pool reads too; each max-pool's int64 indices and its output, the next
    layer's input; the hidden ReLU's 128 values (with dropout also its mask and output); the
    log-softmax over 10 classes and the int64 label. Then the loss."""
    fp32, int64 = 4, 8
    per_image = (
        28 * 28 * fp32  # the image
        + 32 * 28 * 28 * fp32  # convolution 1's ReLU
        + 32 * 14 * 14 * (int64 + fp32)  # its max-pool: indices and output
        + 64 * 14 * 14 * fp32  # convolution 2's ReLU
        + 64 * 7 * 7 * (int64 + fp32)  # its max-pool
        + 128 * fp32 * (3 if dropout else 1)  # the hidden layer (dropout: mask, output)
        + 10 * fp32  # log-softmax
        + int64  # the label
    )
    return batch * per_image + fp32


def sharded_numel(shapes: Iterable[tuple[int, ...]], shards: int) -> int:
    """Elements one rank holds when FSDP splits every tensor's dim 0 over ``shards`` ranks:
    dim 0 is padded up to a multiple of ``shards`` and rank 0 holds ``ceil(rows / shards)``."""
    total = 0
    for shape in shapes:
        rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        total += -(-rows // shards) * rest
    return total


def zero1_partition(numels: Iterable[int], world: int) -> list[int]:
    """Elements of optimizer state per rank under ``ZeroRedundancyOptimizer``: whole tensors,
    largest first, each to the rank holding least so far (its own greedy rule), so the split
    is close to 1/n but not exact when a few tensors are large."""
    sizes = [0] * world
    for numel in sorted(numels, reverse=True):
        sizes[sizes.index(min(sizes))] += numel
    return sizes


def state_bytes_per_rank(
    shapes: Iterable[tuple[int, ...]],
    world: int,
    stage: int,
    precision: str = "fp32",
    root: Iterable[tuple[int, ...]] = (),
    rank: int = 0,
) -> dict[str, int]:
    """Weights (held between forward and backward), gradients and optimizer state on ``rank``.

    Stage 0 is DDP: everything on every rank. ZeRO-1 shards the optimizer state, ZeRO-2 the
    gradients too, ZeRO-3 the weights as well. HSDP is ZeRO-3 inside a shard group: pass that
    group's size as ``world``. ``shapes`` are every parameter's; ``root`` those FSDP2's root
    group keeps gathered from forward to backward (its backward starts at once).
    """
    shapes, root = list(shapes), list(root)
    full = sum(math.prod(s) for s in shapes)
    part = sharded_numel(shapes, world)
    b = bytes_per_parameter(precision)
    optimizer = b["adam"] + b["master"]
    if stage == 1:
        opt_numel = zero1_partition([math.prod(s) for s in shapes], world)[rank]
    else:
        opt_numel = part if stage >= 2 else full
    held = full
    if stage >= 3:
        held = part - sharded_numel(root, world) + sum(math.prod(s) for s in root)
    return {
        "params": b["weights"] * held,
        "grads": b["grads"] * (part if stage >= 2 else full),
        "optimizer": optimizer * opt_numel,
    }


def comm_bytes_per_step(
    shapes: Iterable[tuple[int, ...]],
    world: int,
    strategy: str,
    value_bytes: int = 4,
    root: Iterable[tuple[int, ...]] = (),
) -> dict[str, int]:
    """Bytes handed to each kind of collective in one training step (the whole buffer, before
    the collective splits it across the wire).

    DDP all-reduces every gradient once: Ψ. FSDP (ZeRO-3) all-gathers the weights in forward
    and again in backward, and reduce-scatters the gradients: 3Ψ, dim 0 padded to a multiple
    of ``world``; FSDP2's root group (``root``) stays gathered, so it is gathered once. With
    ``reshard_after_forward=False`` (ZeRO-2 in FSDP2) nothing is gathered again: 2Ψ.
    """
    shapes = list(shapes)
    if strategy == "ddp":
        return {"all_reduce": value_bytes * sum(math.prod(s) for s in shapes)}
    padded = value_bytes * sharded_numel(shapes, world) * world
    again = 0
    if strategy == "zero3":
        again = padded - value_bytes * sharded_numel(root, world) * world
    return {"all_gather": padded + again, "reduce_scatter": padded}


def tp_bytes_per_block(batch: int, seq: int, width: int, value_bytes: int = 4) -> dict[str, int]:
    """All-reduce bytes of one ``GPT`` block under tensor parallelism (q, k, v, w1 column-wise;
    o, w2 row-wise): in forward one all-reduce after ``o`` and one after ``w2``; in backward one
    per column-wise layer (q, k, v, w1) for its input's gradient. Each moves the activations,
    ``batch x seq x width``: TP's traffic grows with the batch, not with the weights."""
    activations = batch * seq * width * value_bytes
    return {"forward": 2 * activations, "backward": 4 * activations}


def wire_bytes_per_rank(collective: str, size: float, world: int) -> float:
    """Bytes each rank sends for a ring collective over a ``size``-byte buffer.

    All-reduce is a reduce-scatter then an all-gather: 2(n-1)/n of the buffer. All-gather,
    reduce-scatter and all-to-all each send (n-1)/n of it. This is nccl-tests' *bus bandwidth*
    factor: busbw = algbw x factor, comparable with the link's speed whatever n is.
    """
    factor = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}[collective]
    return factor * (world - 1) / world * size


def busbw_factor(collective: str, world: int) -> float:
    """busbw / algbw for a collective on ``world`` ranks (nccl-tests' PERFORMANCE.md)."""
    return wire_bytes_per_rank(collective, 1.0, world)


def fit_alpha_beta(sizes: Iterable[float], seconds: Iterable[float]) -> tuple[float, float]:
    """Fit ``t = alpha + size / beta``: alpha the fixed cost of one call (s), beta the bandwidth
    big buffers approach (bytes/s). Residuals are weighted by 1/t, relative errors: a plain
    least-squares fit would let the largest sizes decide alone and leave alpha meaningless."""
    xs, ys = list(map(float, sizes)), list(map(float, seconds))
    w = [1 / y**2 for y in ys]  # minimise sum(((alpha + x / beta - y) / y) ** 2)
    wx = [a * x for a, x in zip(w, xs, strict=True)]
    s1, sx, sxx = sum(w), sum(wx), sum(a * x for a, x in zip(wx, xs, strict=True))
    sy, sxy = (
        sum(a * y for a, y in zip(w, ys, strict=True)),
        sum(a * y for a, y in zip(wx, ys, strict=True)),
    )
    det = s1 * sxx - sx * sx
    alpha, slope = (sxx * sy - sx * sxy) / det, (s1 * sxy - sx * sy) / det
    return max(alpha, 0.0), 1.0 / slope


def predict_seconds(alpha: float, beta: float, sizes: Iterable[float]) -> float:
    """Seconds for calls of these sizes, one after another, under ``t = alpha + size / beta``."""
    return sum(alpha + s / beta for s in sizes)


def gpt_flops_per_step(
    batch: int, seq: int, width: int, layers: int, vocab: int, backward: bool = True
) -> int:
    """Model FLOPs of a forward (x3 with backward) of ``GPT``: 2 per multiply-add of every
    matrix product (the 12 width² of each block, the output layer) plus attention's scores and
    weighted sum, counted whole as ``2 x 2 x seq x width`` per token. The causal mask skips half
    of those; the convention counts them (it is what the hardware is asked to do on most
    kernels), which keeps the figure comparable with published MFU."""
    tokens = batch * seq
    forward = tokens * (2 * 12 * width**2 * layers + 2 * width * vocab + 4 * seq * width * layers)
    return forward * (3 if backward else 1)


def layout_params_per_rank(vocab: int, width: int, layers: int, dp: int, tp: int) -> int:
    """Parameters one rank holds of ``GPT`` with TP over ``tp`` ranks inside each block (q, k,
    v, w1 by rows, o and w2 by columns, the norms and w2's bias whole) and FSDP over ``dp``:
    the block matrices split ``dp x tp`` ways, the rest (embedding, output, norms) ``dp`` ways.
    Widths that divide evenly are assumed: no padding."""
    split = 12 * width**2 + 4 * width  # q, k, v, o, w1, w2 and w1's bias
    whole = 3 * width  # two RMSNorm weights and w2's bias, replicated across the TP group
    return layers * (split // (dp * tp) + whole // dp) + (2 * vocab * width + width) // dp


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Inside ``with SavedBytes(model) as saved:``, autograd hands every tensor it saves for
    backward to a hook; ``saved.bytes`` adds up their storages, each once (a view and its base,
    or one tensor two operations save, share a storage) and the model's weights left out: the
    exact activation memory a formula can be held against, on any device."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._kept: dict[int, int] = {}
        super().__init__(self._pack, lambda t: t)

    def __enter__(self) -> SavedBytes:
        super().__enter__()
        return self

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._weights:
            self._kept[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def bytes(self) -> int:
        return sum(self._kept.values())


class CommBytes(CommDebugMode):
    """``CommDebugMode`` counts the collectives a block of code issues (DTensor's, FSDP2's);
    this also keeps each one's kind and bytes, in order, in ``calls``. The bytes are the whole
    buffer's (an all-gather's output, a reduce-scatter's input), what the formulas count."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = str(getattr(func, "_overloadpacket", "")).replace("allgather", "all_gather")
        kinds = ("all_gather", "reduce_scatter", "all_reduce", "alltoall", "all_to_all")
        collective = name.split(".")[0] in ("c10d", "_c10d_functional", "_c10d_functional_autograd")
        kind = next((k for k in kinds if k in name), None) if collective else None
        if kind and out is not NotImplemented:  # NotImplemented: DTensor decomposes it first
            sides = [torch.utils._pytree.tree_leaves(a) for a in args[:2]]
            size = max(sum(t.nbytes for t in side if torch.is_tensor(t)) for side in sides)
            self.calls.append((kind.replace("alltoall", "all_to_all"), size))
        return out


# GPT-style decoders of common sizes, in this kit's architecture (MLP 4x, no grouped queries):
# vocab, width, layers, heads. The names are the parameter counts gpt_parameters gives.
PRESETS = {
    "162M": (50304, 768, 12, 12),
    "1.4B": (50304, 2048, 24, 16),
    "6.7B": (32000, 4096, 32, 32),
    "13B": (32000, 5120, 40, 40),
    "65B": (32000, 8192, 80, 64),
}


def estimate(
    vocab: int,
    width: int,
    layers: int,
    heads: int,
    seq: int,
    micro_batch: int,
    precision: str = "bf16",
    zero_stage: int = 0,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    checkpointing: bool = False,
    gpus: int = 8,
    gpu_gib: float = 80,
) -> dict[str, float]:
    """Bytes per GPU and bytes sent per GPU per step for a layout, from the functions above.

    TP and PP split the weights (``tp x pp`` ways), ZeRO shards them further over the data-
    parallel ranks ``dp = gpus / (tp pp cp)``. Activations: one micro-batch of the whole model
    (a 1F1B pipeline's first stage keeps ``pp`` micro-batches of its ``layers / pp``), split by
    TP (with sequence parallel) and by CP. Sent per step: the gradient sync (ring factors),
    TP's all-reduces for every layer of this stage, CP's key/value all-gathers, PP's
    activations across one boundary. ``fits`` keeps 10 % of the GPU for the CUDA context and
    the allocator's fragmentation.
    """
    dp = gpus // (tp * pp * cp)
    if dp < 1 or gpus % (tp * pp * cp):
        raise ValueError(  # shown under the calculator's figure: a message for the learner
            _("{gpus} GPUs do not divide into tp {tp} x pp {pp} x cp {cp}").format(
                gpus=gpus, tp=tp, pp=pp, cp=cp
            )
        )
    local = gpt_parameters(vocab, width, layers) / (tp * pp)
    b = bytes_per_parameter(precision)
    value = 2 if precision == "bf16" else 4

    def shard(stage: int) -> int:
        return dp if zero_stage >= stage else 1

    out = {
        "dp": dp,
        "parameters": gpt_parameters(vocab, width, layers),
        "weights": b["weights"] * local / shard(3),
        "grads": b["grads"] * local / shard(2),
        "optimizer": (b["adam"] + b["master"]) * local / shard(1),
    }
    acts = gpt_activation_bytes(micro_batch, seq // cp, width, layers, heads, vocab, checkpointing)
    out["activations"] = acts * value / 4 / (tp * cp)
    out["total"] = out["weights"] + out["grads"] + out["optimizer"] + out["activations"]
    out["fits"] = out["total"] <= 0.9 * gpu_gib * 2**30
    # ZeRO-0..2 send as much as an all-reduce (ZeRO-2: reduce-scatter + all-gather); ZeRO-3 adds
    # one more gather of the weights: 3 (n-1)/n instead of 2 (n-1)/n.
    grad_bytes = b["grads"] * local
    sync = wire_bytes_per_rank("all_reduce", grad_bytes, dp)
    out["sent_dp"] = sync * (1.5 if zero_stage >= 3 else 1)
    tp_block = sum(tp_bytes_per_block(micro_batch, seq // cp, width, value).values())
    out["sent_tp"] = wire_bytes_per_rank("all_reduce", tp_block, tp) * layers / pp
    kv = 2 * micro_batch * seq * width * value / tp  # keys and values of a whole sequence
    out["sent_cp"] = 2 * wire_bytes_per_rank("all_gather", kv, cp) * layers / pp
    out["sent_pp"] = 2 * micro_batch * seq / cp * width * value if pp > 1 else 0.0
    return out
