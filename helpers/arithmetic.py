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
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

from helpers.messages import _

# Bytes each parameter costs with Adam, by where the state is kept. PyTorch's mixed precision
# ("autocast": torch.autocast, or FSDP2's MixedPrecisionPolicy with an fp32 reduce_dtype) keeps
# fp32 weights and gradients, as fp32 training does: 4 + 4 + 8, the bf16 copies of the weights
# being made per operation (activations and temporaries, not state). Megatron and apex hold the
# model in bf16 ("bf16"): bf16 weights and gradients and an fp32 master copy, 2 + 2 + 4 + 8;
# accumulating the gradients in fp32 (Megatron's default) makes it 2 + 4 + 4 + 8 = 18.
BYTES_PER_PARAMETER = {
    "fp32": {"weights": 4, "grads": 4, "master": 0, "adam": 8},
    "autocast": {"weights": 4, "grads": 4, "master": 0, "adam": 8},
    "bf16": {"weights": 2, "grads": 2, "master": 4, "adam": 8},
    "bf16, fp32 grads": {"weights": 2, "grads": 4, "master": 4, "adam": 8},
}


def bytes_per_parameter(precision: str = "fp32") -> dict[str, int]:
    """Weights, gradients, fp32 master copy and Adam's two moments, per parameter, for one of
    ``BYTES_PER_PARAMETER``'s layouts."""
    if precision not in BYTES_PER_PARAMETER:
        raise ValueError(f"precision {precision!r}: one of {sorted(BYTES_PER_PARAMETER)}")
    return dict(BYTES_PER_PARAMETER[precision])


def gpt_parameters(vocab: int, width: int, layers: int) -> int:
    """Parameters of ``helpers.models.GPT``: embedding and output ``vocab x width`` each; per
    block four ``width x width`` attention projections, an MLP ``width -> 4 width -> width``
    with biases, two RMSNorm weights; one final RMSNorm (``Transformer.parameters``)."""
    return Transformer(vocab, width, layers, heads=1).parameters


def gpt_activation_bytes(
    batch: int,
    seq: int,
    width: int,
    layers: int,
    heads: int,
    vocab: int,
    checkpoint: bool = False,
    value_bytes: int = 4,
    autocast: bool = False,
) -> int:
    """Bytes autograd keeps between forward and backward for ``GPT`` (loss included): the kit's
    model as a ``Transformer``, counted by ``transformer_activation_bytes`` (the terms are
    listed there and derived in notebook 12)."""
    model = Transformer(vocab, width, layers, heads)
    return transformer_activation_bytes(model, batch, seq, value_bytes, checkpoint, autocast)


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


def mlp_block_activation_bytes(rows: int, width: int, hidden: int, value_bytes: int = 4) -> int:
    """Bytes autograd keeps for one pre-norm MLP block, ``x + w2(gelu(w1(layer_norm(x))))``
    (notebook 07's TinyNet, where this count is derived), for ``rows`` rows: each operation
    keeps what its backward reads. LayerNorm keeps its input ``x`` and its fp32 mean and 1/std
    per row; w1 keeps its input, the normalised ``x``; GELU its input, w1's output; w2 its input,
    GELU's output. So ``2 width + 2 hidden`` values and two fp32 scalars per row; the residual
    add keeps nothing, and the weights are parameters, not activations."""
    return rows * ((2 * width + 2 * hidden) * value_bytes + 2 * 4)


def mlp_net_activation_bytes(
    rows: int, width: int, hidden: int, depth: int, classes: int, value_bytes: int = 4
) -> int:
    """Bytes autograd keeps for notebook 07's TinyNet (an embedding, ``depth`` MLP blocks, a
    head) and its cross-entropy loss: the blocks, the head's input (the last block's output),
    the log-softmax over ``classes``, the loss and its fp32 total weight. The batch itself was
    made before forward: it is the caller's, not an activation."""
    blocks = depth * mlp_block_activation_bytes(rows, width, hidden, value_bytes)
    return blocks + rows * (width + classes) * value_bytes + 2 * 4


def sharded_numel(shapes: Iterable[tuple[int, ...]], shards: int) -> int:
    """Elements one rank holds when FSDP splits every tensor's dim 0 over ``shards`` ranks:
    dim 0 is padded up to a multiple of ``shards`` and rank 0 holds ``ceil(rows / shards)``."""
    total = 0
    for shape in shapes:
        rows, rest = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
        total += -(-rows // shards) * rest
    return total


def zero1_tensors(numels: Iterable[int], world: int) -> list[list[int]]:
    """The tensors (their element counts) whose optimizer state each rank keeps under
    ``ZeroRedundancyOptimizer``: whole tensors, largest first, each to the rank holding least
    so far (its own greedy rule), so the split is close to 1/n but not exact."""
    ranks: list[list[int]] = [[] for _ in range(world)]
    for numel in sorted(numels, reverse=True):
        min(ranks, key=sum).append(numel)
    return ranks


def zero1_partition(numels: Iterable[int], world: int) -> list[int]:
    """Elements of optimizer state per rank under ZeroRedundancyOptimizer (``zero1_tensors``)."""
    return [sum(r) for r in zero1_tensors(numels, world)]


def state_bytes_per_rank(
    shapes: Iterable[tuple[int, ...]],
    world: int,
    stage: int,
    precision: str = "fp32",
    root: Iterable[tuple[int, ...]] = (),
    rank: int = 0,
    bucket_view: bool = False,
) -> dict[str, int]:
    """Bytes ``rank`` holds, as torch's memory trackers count them: weights between forward and
    backward, gradients after backward, optimizer state after the step.

    Stage 0 is DDP: everything on every rank, and the gradients twice: DDP's reducer copies
    them into flat buckets for its all-reduces unless ``gradient_as_bucket_view=True``
    (``bucket_view``). ZeRO-1 (``ZeroRedundancyOptimizer``) shards the optimizer state by whole
    tensors. ZeRO-2 (FSDP2, ``reshard_after_forward=False``) shards the gradients and keeps
    the sharded weights while the gathered ones live from forward to backward: 1/n + 1 of them
    (dim 0 padded to a multiple of n). ZeRO-3 holds the shards, plus whatever group stays
    gathered (``root``: FSDP2's root when its ``reshard_after_forward`` is left ``None``). HSDP
    is ZeRO-3 inside a shard group: pass that group's size as ``world``. Adam keeps a 4-byte
    ``step`` per tensor it updates (under FSDP2 every tensor, even where a shard is empty).
    """
    shapes, root = list(shapes), list(root)
    numels = [math.prod(s) for s in shapes]
    full, part = sum(numels), sharded_numel(shapes, world)
    b = bytes_per_parameter(precision)
    if stage <= 1:
        params, grads = full, full * (1 if bucket_view else 2)
    else:
        gathered = part * world if stage == 2 else sharded_numel(root, world) * world
        params, grads = part + gathered, part
    mine = zero1_tensors(numels, world)[rank] if stage == 1 else numels
    opt_numel = part if stage >= 2 else sum(mine)
    return {
        "params": b["weights"] * params,
        "grads": b["grads"] * grads,
        "optimizer": (b["adam"] + b["master"]) * opt_numel + 4 * len(mine),
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


TP_PLANS = {"megatron": (2, 2), "separate_qkv": (2, 4)}  # all-reduces: (forward, backward)


def tp_bytes_per_block(
    batch: int, seq: int, width: int, value_bytes: int = 4, plan: str = "megatron"
) -> dict[str, int]:
    """All-reduce bytes of one transformer block under tensor parallelism, per micro-batch.

    Both plans split q, k, v and w1 column-wise and o and w2 row-wise, so forward all-reduces
    twice: after ``o`` and after ``w2``. Backward depends on where the input is replicated.
    ``"megatron"`` (Megatron-LM; in PyTorch a ``PrepareModuleInput`` on attention) makes each
    sub-layer's input one replicated tensor, whose gradient q, k and v (or the MLP's column
    layers) add up locally and all-reduce once: 2 in backward too. ``"separate_qkv"`` (q, k, v
    and w1 each a ``ColwiseParallel`` on a plain tensor) all-reduces each one's input gradient:
    4. Each moves the activations, ``batch x seq x width``: TP's traffic grows with the batch,
    not the weights. With sequence parallelism every all-reduce becomes an all-gather and a
    reduce-scatter of the same buffer: the same bytes on the wire.
    """
    if plan not in TP_PLANS:
        raise ValueError(f"plan {plan!r}: one of {sorted(TP_PLANS)}")
    activations = batch * seq * width * value_bytes
    forward, backward = TP_PLANS[plan]
    return {"forward": forward * activations, "backward": backward * activations}


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


# ------------------------------------------------------------------------- the calculator


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer as training reports describe one: vocabulary, width (hidden
    size), layers, query heads, key/value heads (grouped-query attention: fewer than ``heads``),
    the MLP's hidden width ``ffn``, whether the MLP is gated (SwiGLU: three matrices, not two),
    whether the output layer reuses the embedding (``tied``) and whether the MLP's layers have
    biases. Attention projections have no bias and every norm is an RMSNorm (one weight), as
    in both the kit's GPT and Llama.

    The defaults are the kit's ``helpers.models.GPT``: ``Transformer(vocab, width, layers,
    heads)`` is that model (MLP ``4 width`` with biases, untied), so its ``parameters`` equal
    ``gpt_parameters``. ``kv_heads`` and ``ffn`` left ``None`` become ``heads`` and ``4 width``.
    """

    vocab: int
    width: int
    layers: int
    heads: int
    kv_heads: int | None = None
    ffn: int | None = None
    gated: bool = False
    tied: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        # Resolved here so two descriptions of one model compare (and hash) equal.
        object.__setattr__(self, "kv_heads", self.kv_heads or self.heads)
        object.__setattr__(self, "ffn", self.ffn or 4 * self.width)
        if self.width % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"width {self.width}, heads {self.heads}, kv_heads {self.kv_heads}: width must "
                "divide by heads and heads by kv_heads"
            )

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): smaller than ``width`` with grouped queries."""
        return self.kv_heads * self.head_dim

    @property
    def block_parameters(self) -> int:
        """One block: q and o ``width x width``, k and v ``width x kv_width``, the MLP's two
        (gated: three) ``width x ffn`` matrices and their biases if any, two RMSNorm weights."""
        attention = 2 * self.width**2 + 2 * self.width * self.kv_width
        matrices = 3 if self.gated else 2
        mlp = matrices * self.width * self.ffn
        if self.bias:  # every matrix but the last widens to ffn; the last narrows to width
            mlp += (matrices - 1) * self.ffn + self.width
        return attention + mlp + 2 * self.width

    @property
    def parameters(self) -> int:
        """Every parameter: embedding (and an output layer unless tied), blocks, final norm."""
        embeddings = (1 if self.tied else 2) * self.vocab * self.width
        return embeddings + self.layers * self.block_parameters + self.width


# Models of common sizes. The kit-style ones are helpers.models.GPT scaled up (MLP 4x with
# biases, no grouped queries), named by the parameter count gpt_parameters gives; the Llama
# ones are as their papers and released configurations describe them (Touvron et al. 2023,
# Llama 2, Table 1 and config.json; Meta's Llama 3 8B config.json), exact parameter counts
# 6,738,415,616 (Llama-2-7B), 13,015,864,320, 68,976,648,192 and 8,030,261,248.
PRESETS = {
    "162M": Transformer(50304, 768, 12, 12),
    "1.4B": Transformer(50304, 2048, 24, 16),
    "6.7B": Transformer(32000, 4096, 32, 32),
    "13B": Transformer(32000, 5120, 40, 40),
    "65B": Transformer(32000, 8192, 80, 64),
    "Llama-2-7B": Transformer(32000, 4096, 32, 32, ffn=11008, gated=True, bias=False),
    "Llama-2-13B": Transformer(32000, 5120, 40, 40, ffn=13824, gated=True, bias=False),
    "Llama-2-70B": Transformer(32000, 8192, 80, 64, 8, ffn=28672, gated=True, bias=False),
    "Llama-3-8B": Transformer(128256, 4096, 32, 32, 8, ffn=14336, gated=True, bias=False),
}


def transformer_block_activation_bytes(
    model: Transformer, batch: int, seq: int, value_bytes: int = 4, autocast: bool = False
) -> int:
    """Bytes autograd keeps for one block without checkpointing, its input included.

    In one dtype (``value_bytes``: fp32, or a model held in bf16), the kit's 19 vectors of
    ``width`` per token are, by what each is as wide as: nine of ``width`` (each norm's input,
    normalised and scaled values, rotated q, the attention output and its reshaped copy), two
    of ``kv_width`` (rotated k, v: attention saves them as wide as they are) and two of ``ffn``
    (the MLP's pre- and post-GELU values); a gated MLP keeps four (the gate's input and SiLU
    output, the up projection, their product). Then the two norms' fp32 scales per token,
    attention's fp32 log-sum-exp per query head and token, RoPE's cos and sin.

    Under bf16 ``autocast`` only the matrix products and attention run in bf16: the residual
    stream stays fp32 (fp32 + bf16 is fp32), so each norm keeps its input and normalised value
    in fp32 (4 vectors x 4 bytes); its scaled output is not kept, but a bf16 cast of it is, one
    per matrix product that reads it (q, k, v, and the MLP's first one or two); rotated q, k,
    v, attention's output and its copy, the MLP's values in bf16; and every matrix product
    saves the bf16 copy of its weight. The kit's GPT: 50 bytes per token and width, not 76.

    Exact for the kit's GPT on CPU (tests/test_arithmetic.py holds it against autograd, and
    notebook 12 against MemTracker); for other architectures an approximation: it assumes
    attention that takes the grouped k and v as they are (no ``repeat_kv`` copy), no dropout.
    """
    tokens, w, kv, ffn = batch * seq, model.width, model.kv_width, model.ffn
    mlp = (4 if model.gated else 2) * ffn
    small = 2 * tokens * 4 + batch * model.heads * seq * 4  # 1/rms per norm; log-sum-exp: fp32
    if not autocast:
        vectors = 9 * w + 2 * kv + mlp
        rope = 2 * seq * model.head_dim * value_bytes  # cos, sin for q and for k
        return tokens * vectors * value_bytes + small + rope
    casts = (5 if model.gated else 4) * w  # q, k, v and the MLP's first: each casts again
    bf16 = casts + 3 * w + 2 * kv + mlp  # + rotated q, k, v, attention out and its copy
    weights = 2 * w * w + 2 * w * kv + (3 if model.gated else 2) * w * ffn  # bf16 copies
    return tokens * (4 * w * 4 + bf16 * 2) + small + 2 * seq * model.head_dim * 2 + weights * 2


def output_activation_bytes(
    model: Transformer, batch: int, seq: int, value_bytes: int = 4, autocast: bool = False
) -> int:
    """Bytes autograd keeps after the blocks: the final norm's three vectors and fp32 scale,
    the log-softmax over the vocabulary, the int64 token ids, the loss. Under ``autocast``:
    the norm's input and normalised value in fp32, the output layer's bf16 input and weight
    copies, and the log-softmax in fp32 (the loss computed on ``logits.float()``)."""
    tokens, w = batch * seq, model.width
    ids_and_loss = tokens * 8 + 4
    if autocast:
        norm = tokens * w * (4 + 4 + 2) + tokens * 4 + model.vocab * w * 2
        return norm + tokens * model.vocab * 4 + ids_and_loss
    norm = 3 * tokens * w * value_bytes + tokens * 4
    return norm + tokens * model.vocab * value_bytes + ids_and_loss


def transformer_activation_bytes(
    model: Transformer,
    batch: int,
    seq: int,
    value_bytes: int = 4,
    checkpoint: bool = False,
    autocast: bool = False,
) -> int:
    """Bytes autograd keeps between forward and backward for ``model`` (loss included): equal
    to ``gpt_activation_bytes`` for the kit's GPT. With activation checkpointing a block keeps
    only its input (fp32 under autocast: the residual stream); backward recomputes the rest one
    block at a time (``backward_peak_bytes``)."""
    if checkpoint:
        per_block = batch * seq * model.width * (4 if autocast else value_bytes)
    else:
        per_block = transformer_block_activation_bytes(model, batch, seq, value_bytes, autocast)
    head = output_activation_bytes(model, batch, seq, value_bytes, autocast)
    return model.layers * per_block + head


def backward_peak_bytes(
    model: Transformer,
    batch: int,
    seq: int,
    value_bytes: int = 4,
    checkpoint: bool = False,
    autocast: bool = False,
) -> int:
    """Activations and temporaries alive at backward's peak (weight gradients not counted: they
    exist before it when ``zero_grad(set_to_none=False)``), the largest of three moments:

    - the loss's backward: every activation, + the gradients of the log-softmax and logits;
    - the final norm's backward: the head's activations freed but the norm's input, + about 5
      vectors of temporaries (on CPU its backward is pow, mean, rsqrt and mul, op by op);
    - the last block's MLP backward, right after recomputing that block when checkpointing:
      the blocks' activations (checkpointing: every block's input + one whole block), + the
      residual stream's gradient, the gradient of the last matrix product's input and its
      weight gradient (under autocast also its bf16 result).

    Measured with MemTracker on CPU for the kit's GPT (notebook 12): exact without
    checkpointing; with it, up to 2.5 % above (a bf16 weight gradient already freed).
    """
    tokens, w, vocab = batch * seq, model.width, model.vocab
    stream = 4 if autocast else value_bytes  # the residual stream's dtype
    logits = 4 if autocast else value_bytes  # the loss is computed in fp32 under autocast
    u = tokens * w * stream
    act = transformer_activation_bytes(model, batch, seq, value_bytes, checkpoint, autocast)
    at_loss = act + 2 * tokens * vocab * logits
    output_input = tokens * w * 2 + vocab * w * 2 if autocast else u
    at_norm = act - tokens * vocab * logits - tokens * 4 - u - output_input + 5 * u
    full = transformer_block_activation_bytes(model, batch, seq, value_bytes, autocast)
    blocks = model.layers * u + full - u if checkpoint else model.layers * full
    matmul = 2 if autocast else value_bytes  # the dtype the matrix products compute in
    weight_grad = model.ffn * w * ((4 + 2) if autocast else value_bytes)
    temps = u + tokens * model.ffn * matmul + weight_grad
    return max(at_loss, at_norm, blocks + temps + tokens * 8)


def zero_model_state_bytes(
    psi: float, nd: int, stage: int, k: int = 12, weights: int = 2, grads: int = 2
) -> dict[str, float]:
    """Model-state bytes per data-parallel rank under ZeRO, as the ZeRO paper (Rajbhandari et
    al., SC'20, section 3 and Table 1) writes them: ``weights`` and ``grads`` bytes per parameter
    (2 and 2: fp16) and ``k`` of optimizer state (12: fp32 master, momentum, variance), over
    ``psi`` parameters and ``nd`` ranks. Stage 0 replicates all, ZeRO-1 (P_os) divides the
    optimizer state by ``nd``, ZeRO-2 (P_os+g) the gradients too, ZeRO-3 (P_os+g+p) the weights.

    ``estimate`` calls this very function with ``bytes_per_parameter``'s numbers, so the
    paper's table checks the calculator itself. It assumes even shards: FSDP's padding
    (``sharded_numel``) and ZeroRedundancyOptimizer's whole-tensor split (``zero1_partition``)
    are what ``state_bytes_per_rank`` adds for a real model.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage}: one of 0, 1, 2, 3")

    def shard(from_stage: int) -> int:
        return nd if stage >= from_stage else 1

    return {
        "weights": weights * psi / shard(3),
        "grads": grads * psi / shard(2),
        "optimizer": k * psi / shard(1),
    }


# Transcribed from the ZeRO paper (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
# Training Trillion Parameter Models", SC'20), Table 1: per-device model-state memory in GB
# (1e9 bytes) with mixed-precision Adam (K = 12), by model and data-parallel degree Nd; columns
# baseline, P_os, P_os+g, P_os+g+p, as printed. The 7.5B model's figures at Nd = 64 also appear
# in its Figure 1.
ZERO_PAPER_TABLE1: dict[str, tuple[float, dict[int, tuple[float, float, float, float]]]] = {
    "7.5B": (
        7.5e9,
        {
            1: (120, 120, 120, 120),
            4: (120, 52.5, 41.3, 30),
            16: (120, 35.6, 21.6, 7.5),
            64: (120, 31.4, 16.6, 1.88),
            256: (120, 30.4, 15.4, 0.47),
            1024: (120, 30.1, 15.1, 0.12),
        },
    ),
    "128B": (
        128e9,
        {
            1: (2048, 2048, 2048, 2048),
            4: (2048, 896, 704, 512),
            16: (2048, 608, 368, 128),
            64: (2048, 536, 284, 32),
            256: (2048, 518, 263, 8),
            1024: (2048, 513, 257, 2),
        },
    ),
    "1T": (
        1e12,
        {
            1: (16000, 16000, 16000, 16000),
            4: (16000, 7000, 5500, 4000),
            16: (16000, 4750, 2875, 1000),
            64: (16000, 4187.5, 2218.75, 250),
            256: (16000, 4046.9, 2054.7, 62.5),
            1024: (16000, 4011.7, 2013.7, 15.6),
        },
    ),
}


def zero_paper_comparison() -> list[tuple[str, int, int, float, float, float]]:
    """Every figure of ``ZERO_PAPER_TABLE1`` beside ``zero_model_state_bytes``'s: rows of
    (model, nd, stage, paper GB, ours GB, ours / paper)."""
    rows = []
    for name, (psi, by_nd) in ZERO_PAPER_TABLE1.items():
        for nd, printed in by_nd.items():
            for stage, paper in enumerate(printed):
                ours = sum(zero_model_state_bytes(psi, nd, stage).values()) / 1e9
                rows.append((name, nd, stage, paper, ours, ours / paper))
    return rows


REDUCE_BYTES = {"fp32": 4, "bf16": 2}


def data_parallel_wire_bytes(
    psi: float,
    dp: int,
    stage: int,
    precision: str = "bf16",
    reduce_dtype: str = "fp32",
    micro_batches: int = 1,
) -> dict[str, float]:
    """Bytes each data-parallel rank sends per optimizer step, by collective (ring factors of
    ``wire_bytes_per_rank``), for ``psi`` parameters over ``dp`` ranks and ``micro_batches``
    micro-batches of gradient accumulation.

    Gradients travel in ``reduce_dtype`` (DDP under autocast reduces the fp32 gradients; the
    kit's FSDP2 recipe sets ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``).
    Weights travel as the model computes with them (``bytes_per_parameter``'s ``weights``:
    FSDP2 all-gathers in ``param_dtype``), except ZeRO-1's broadcast, which sends the copy the
    optimizer stepped: fp32 (PyTorch's autocast keeps fp32 parameters, the kit's "master").

    - Stage 0, DDP: one all-reduce of the gradients, 2(n-1)/n Ψ; accumulation under
      ``no_sync`` syncs once per step.
    - ZeRO-1, ``ZeroRedundancyOptimizer`` with DDP: that all-reduce, then each rank broadcasts
      the partition it updated, Ψ/n to every other: (n-1)/n Ψ, as much as one all-gather.
    - ZeRO-2, FSDP2 with ``reshard_after_forward=False``: reduce-scatter the gradients, (n-1)/n
      Ψ, for every micro-batch (holding the gradients sharded is ZeRO-2's point, so they cannot
      wait unreduced), and all-gather the updated weights once per step, (n-1)/n Ψ.
    - ZeRO-3, FSDP2: per micro-batch, the reduce-scatter and two all-gathers of the weights
      (forward, and backward again): 3(n-1)/n Ψ each micro-batch.
    """
    if reduce_dtype not in REDUCE_BYTES:
        raise ValueError(f"reduce_dtype {reduce_dtype!r}: one of {sorted(REDUCE_BYTES)}")
    b = bytes_per_parameter(precision)
    grads, weights = REDUCE_BYTES[reduce_dtype] * psi, b["weights"] * psi
    stepped = (b["master"] or b["weights"]) * psi
    if stage == 0:
        return {"all_reduce": wire_bytes_per_rank("all_reduce", grads, dp)}
    if stage == 1:  # dp broadcasts of psi / dp each: the wire bytes of one all-gather of psi
        return {
            "all_reduce": wire_bytes_per_rank("all_reduce", grads, dp),
            "broadcast": wire_bytes_per_rank("all_gather", stepped, dp),
        }
    if stage not in (2, 3):
        raise ValueError(f"ZeRO stage {stage}: one of 0, 1, 2, 3")
    gathers = 1 if stage == 2 else 2 * micro_batches
    return {
        "reduce_scatter": micro_batches * wire_bytes_per_rank("reduce_scatter", grads, dp),
        "all_gather": gathers * wire_bytes_per_rank("all_gather", weights, dp),
    }


def check_layout(model: Transformer, seq: int, tp: int, pp: int, cp: int, gpus: int) -> int:
    """The data-parallel degree ``gpus / (tp pp cp)``, or a ValueError for a layout PyTorch
    (or Megatron) cannot run, saying why and what to change.

    TP gives each rank whole query and key/value heads and a slice of the vocabulary (the
    embedding and output split by rows); ``estimate`` assumes sequence parallelism with TP,
    which splits each CP rank's ``seq / cp`` tokens ``tp`` ways. Context parallelism is taken
    load-balanced, as ``torch``'s ``context_parallel`` does by default: the sequence is cut into
    ``2 cp`` chunks and each rank gets one from each end (causal attention's work evens out),
    so ``seq`` must divide by ``2 cp``. PP gives each stage ``layers / pp`` whole blocks.
    """
    if gpus % (tp * pp * cp):
        raise ValueError(  # shown under the calculator's figure: a message for the learner
            _(
                "{gpus} GPUs do not divide into tp {tp} x pp {pp} x cp {cp}: choose degrees "
                "whose product divides the GPU count"
            ).format(gpus=gpus, tp=tp, pp=pp, cp=cp)
        )
    for heads, what in (
        (model.heads, _("attention heads")),
        (model.kv_heads, _("key/value heads")),
    ):
        if heads % tp:
            raise ValueError(
                _(
                    "tp {tp} does not divide the model's {heads} {what}, and each rank must hold "
                    "whole heads: choose a tp that divides {heads}"
                ).format(tp=tp, heads=heads, what=what)
            )
    if model.vocab % tp:
        padded = -(-model.vocab // (128 * tp)) * 128 * tp
        raise ValueError(
            _(
                "the vocabulary of {vocab} does not divide by tp {tp}: pad it to a multiple of tp "
                "({padded}, as Megatron pads to 128 x tp)"
            ).format(vocab=model.vocab, tp=tp, padded=padded)
        )
    if model.layers % pp:
        raise ValueError(
            _(
                "{layers} layers do not split into pp {pp} equal stages: "
                "choose a pp that divides {layers}"
            ).format(layers=model.layers, pp=pp)
        )
    if cp > 1 and seq % (2 * cp):
        raise ValueError(
            _(
                "sequence {seq} does not cut into the 2 x cp = {chunks} chunks load-balanced "
                "context parallelism needs: choose a sequence length that divides by {chunks}"
            ).format(seq=seq, chunks=2 * cp)
        )
    if seq % (cp * tp):
        raise ValueError(
            _(
                "sequence {seq} over cp {cp} does not divide by tp {tp}, which sequence "
                "parallelism splits it by: choose a sequence length that divides by {n}"
            ).format(seq=seq, cp=cp, tp=tp, n=cp * tp)
        )
    return gpus // (tp * pp * cp)


def activation_bytes_per_gpu(
    model: Transformer,
    seq: int,
    micro_batch: int,
    value_bytes: int,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    checkpointing: bool = False,
    micro_batches: int = 1,
    autocast: bool = False,
) -> dict[str, float]:
    """Activations one GPU stores (``"activations"``) and its peak in backward
    (``"activation_peak"``, ``backward_peak_bytes``), for the busiest pipeline stage, the first.

    CP gives each rank ``seq / cp`` tokens; TP with sequence parallelism splits the rest ``tp``
    ways (the vocabulary-parallel loss splits the logits). A 1F1B pipeline's first stage holds
    ``min(pp, micro_batches)`` micro-batches of its ``layers / pp`` blocks; the output layer's
    activations (on the last stage, one micro-batch) are added too: a bound, exact for pp = 1.
    """
    local = seq // cp
    stage = replace(model, layers=model.layers // pp)
    args = (stage, micro_batch, local, value_bytes)
    one = transformer_activation_bytes(*args, checkpointing, autocast)
    waiting = one - output_activation_bytes(*args, autocast)  # a micro-batch's blocks ...
    waiting *= min(pp, micro_batches) - 1  # ... for each earlier one still in flight
    peak = backward_peak_bytes(*args, checkpointing, autocast)
    return {"activations": (one + waiting) / tp, "activation_peak": (peak + waiting) / tp}


def estimate(
    model: Transformer,
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
    micro_batches: int = 1,
    reduce_dtype: str = "fp32",
) -> dict[str, float]:
    """Bytes per GPU, and bytes each GPU sends per optimizer step, for a layout of ``model``.

    One optimizer step is ``micro_batches`` micro-batches of ``micro_batch`` sequences each
    (gradient accumulation) on each of the ``dp = gpus / (tp pp cp)`` data-parallel ranks
    (``check_layout`` refuses layouts that cannot run). TP and PP split the weights ``tp x pp``
    ways, ZeRO shards them further over ``dp`` (``zero_model_state_bytes``). Activations: one
    micro-batch, and a pipeline's in-flight ones (``activation_bytes_per_gpu``); ``total`` and
    ``fits`` take the peak, keeping 10 % of the GPU for the CUDA context and fragmentation.

    Sent per step: the data-parallel collectives (``data_parallel_wire_bytes``: once per step
    or per micro-batch, stage by stage), and for every micro-batch TP's four all-reduces per
    block of this stage (Megatron's plan), CP's all-gathers of keys and values (forward and
    backward) and PP's boundary activation and its gradient, split by TP (Megatron's scatter
    and gather across the TP group).
    """
    dp = check_layout(model, seq, tp, pp, cp, gpus)
    if micro_batches < 1:
        raise ValueError(
            _("micro_batches is {m}: a step needs at least one").format(m=micro_batches)
        )
    b = bytes_per_parameter(precision)
    value = 4 if precision == "fp32" else 2  # what activations and TP, CP, PP traffic are in
    local = model.parameters / (tp * pp)
    state = zero_model_state_bytes(
        local, dp, zero_stage, k=b["adam"] + b["master"], weights=b["weights"], grads=b["grads"]
    )
    autocast = precision == "autocast"
    acts = activation_bytes_per_gpu(
        model, seq, micro_batch, value, tp, pp, cp, checkpointing, micro_batches, autocast
    )
    out: dict[str, float] = {"dp": dp, "parameters": model.parameters, **state, **acts}
    out["total"] = sum(state.values()) + acts["activation_peak"]
    out["fits"] = out["total"] <= 0.9 * gpu_gib * 2**30
    sync = data_parallel_wire_bytes(local, dp, zero_stage, precision, reduce_dtype, micro_batches)
    out["sent_dp"] = sum(sync.values())
    stage_blocks = micro_batches * model.layers // pp  # blocks this stage runs per step
    block = tp_bytes_per_block(micro_batch, seq // cp, model.width, value, "megatron")
    out["sent_tp"] = wire_bytes_per_rank("all_reduce", sum(block.values()), tp) * stage_blocks
    kv = 2 * micro_batch * seq * model.kv_width * value / tp  # keys and values, whole sequence
    out["sent_cp"] = 2 * wire_bytes_per_rank("all_gather", kv, cp) * stage_blocks
    boundary = micro_batch * seq // cp * model.width * value / tp
    out["sent_pp"] = 2 * boundary * micro_batches if pp > 1 else 0.0
    return out
