"""Text for the transformer lessons: English prose that every Python installation ships.

``pydoc_data.topics`` holds the text ``help()`` shows for Python's keywords and topics (about
465,000 characters of English with code examples): no download, the same bytes on every
machine with the same Python, so a run is comparable across machines offline. The model reads
characters (about 100 distinct ones), which keeps the vocabulary, and so the embedding and the
output layer, small enough for a CPU.
"""

from __future__ import annotations

import torch


def corpus() -> str:
    """The prose of every pydoc topic, in a fixed order."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


class Characters:
    """A character-level tokenizer: one id per distinct character of the text it was built on."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        unknown = sorted(set(text) - self.ids.keys())
        if unknown:
            raise ValueError(
                f"characters {unknown!r} are not in the vocabulary; build it on this text"
            )
        return torch.tensor([self.ids[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def tokens() -> tuple[torch.Tensor, Characters]:
    """The whole corpus as ids, and the tokenizer that reads them back."""
    text = corpus()
    chars = Characters(text)
    return chars.encode(text), chars


def batch(
    ids: torch.Tensor, size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` random windows of ``seq_len`` ids and the same windows shifted by one (targets).

    Drawn from ``generator``: ranks that seed it alike draw the same batch, which is what
    tensor and context parallelism need (every rank of a group sees the same sequences).
    """
    if seq_len >= len(ids):
        raise ValueError(f"seq_len={seq_len} must be shorter than the text ({len(ids)} tokens)")
    starts = torch.randint(0, len(ids) - seq_len, (size,), generator=generator)
    windows = torch.stack([ids[s : s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]
