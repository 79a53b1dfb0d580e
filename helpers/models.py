"""The models the lessons train, and what they weigh: parameters and bytes.

``SimpleCNN`` is a two-convolution CNN with its shapes fixed for 1x28x28 MNIST. It has no
dropout and no batch norm by default, so one process on the global batch and DDP on shards
compute the same maths, which the DDP lessons check (up to float rounding).

``GPT`` is a small decoder-only transformer (RoPE, RMSNorm, causal attention, GELU MLP) whose
module names (``attention.q``, ``mlp.w1``, ``output``...) are what the tensor-parallel plans of
notebook 09 name; ``MoE`` is a mixture-of-experts layer, the reference that notebook 11's
expert parallelism must equal.
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


class MLP(nn.Module):
    """A transformer block's feed-forward part: widen to ``hidden``, GELU, narrow back.

    ``w1`` and ``w2`` are the names tensor-parallel plans refer to: ``w1`` splits by output
    features (column-wise), ``w2`` by input features (row-wise), one all-reduce after ``w2``.
    """

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(width, hidden)
        self.w2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.gelu(self.w1(x)))


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoPE) of ``x`` [..., seq, head_dim] at ``positions`` [seq].

    Position enters as a rotation of each pair of features of queries and keys, so attention
    scores depend on the distance between two tokens. Passing the positions (not assuming
    0..seq-1) lets a rank that holds a slice of the sequence rotate it as the whole would be.
    """
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = positions.to(torch.float32)[:, None] * freq[None, :]  # [seq, half]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with separate ``q``, ``k``, ``v`` and ``o`` projections.

    The head count is read from the projections' output (``-1`` below), not stored: under
    tensor parallelism each rank's ``q`` has ``width / n`` outputs, so it runs ``heads / n``
    whole heads, and the same code serves the dense and the split model.
    """

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} must divide by heads={heads}")
        self.head_dim = width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.o = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device)

        def heads(y: torch.Tensor) -> torch.Tensor:  # [b, t, h*d] -> [b, h, t, d]
            return y.view(b, t, -1, self.head_dim).transpose(1, 2)

        q, k = rotate(heads(self.q(x)), positions), rotate(heads(self.k(x)), positions)
        y = nn.functional.scaled_dot_product_attention(q, k, heads(self.v(x)), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(width)
        self.attention = Attention(width, heads)
        self.mlp_norm = nn.RMSNorm(width)
        self.mlp = MLP(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """A small GPT-style decoder: token embedding, ``layers`` blocks, a final norm, the output.

    No dropout, so one process and a split model compute the same maths. Positions come from
    RoPE inside attention, so no module depends on the sequence length: any length trains.
    The forward pass returns logits [batch, seq, vocab]; the loss is left to the caller,
    because tensor parallelism computes it on logits split by vocabulary (``loss_parallel``).
    """

    def __init__(self, vocab: int, width: int = 64, heads: int = 4, layers: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.output(self.norm(x))


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer: a router sends each token to ``top_k`` experts.

    The router scores every expert per token; each token goes through its ``top_k`` best and
    their outputs are summed, weighted by the router's softmax probabilities. This is the
    one-process reference: every expert sits here. Expert parallelism puts the experts on
    different ranks and moves the tokens to them (``all_to_all``), computing the same sum.
    """

    def __init__(self, width: int, hidden: int, experts: int, top_k: int = 1):
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k={top_k} must be between 1 and experts={experts}")
        self.top_k = top_k
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(MLP(width, hidden) for _ in range(experts))

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token [n, width]: the weights [n, top_k] and the experts [n, top_k] it goes to."""
        probabilities = self.router(tokens).softmax(dim=-1)
        return probabilities.topk(self.top_k, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if len(token):
                out.index_add_(0, token, weights[token, slot, None] * expert(tokens[token]))
        return out.view_as(x)
