"""helpers.text: pydoc's prose as characters, read back exactly, and batches drawn reproducibly."""

from __future__ import annotations

import pytest
import torch

from helpers import text


def test_the_corpus_is_english_prose_of_the_expected_size() -> None:
    corpus = text.corpus()
    assert 400_000 < len(corpus) < 600_000  # ~465,000 characters with CPython 3.11
    assert corpus.startswith('The "assert" statement')  # topics in sorted order: "assert" first
    assert 'The "if" statement' in corpus


def test_characters_read_back_exactly() -> None:
    chars = text.Characters("hello world")
    assert chars.vocab == 8
    assert chars.decode(chars.encode("low hello")) == "low hello"


def test_a_character_outside_the_vocabulary_is_named() -> None:
    with pytest.raises(ValueError, match=r"characters \['z'\] are not in the vocabulary"):
        text.Characters("abc").encode("abz")


def test_targets_are_the_inputs_shifted_by_one() -> None:
    ids = torch.arange(100)
    x, y = text.batch(ids, 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


def test_the_same_seed_draws_the_same_batch_on_every_rank() -> None:
    ids = torch.arange(1000)
    first = text.batch(ids, 8, 16, torch.Generator().manual_seed(1))
    again = text.batch(ids, 8, 16, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_a_window_longer_than_the_text_is_refused() -> None:
    with pytest.raises(ValueError, match="seq_len=50 must be shorter than the text"):
        text.batch(torch.arange(50), 2, 50, torch.Generator())
