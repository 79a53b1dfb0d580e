"""labtools.claims: no lesson asserts an outcome its cells measure (issue 44)."""

from __future__ import annotations

import nbformat
import pytest

from labtools import claims


def lesson(*markdown: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(m) for m in markdown])


@pytest.mark.parametrize(
    "sentence",
    [
        "Here it cannot be faster: one device does all the work.",  # 01 printed 1.06x
        "Adam reaches about 0.9 in one epoch.",  # 03 printed 0.99
        "Each knob is measured against the bound no setting can beat.",  # 04 printed 1.13
        "AMP makes this model 2.1× faster.",
        "The pipeline reaches 420 img/s.",
    ],
)
def test_the_kinds_of_mismatch_issue_44_found_are_claims(sentence):
    [found] = claims.unreviewed("99_test", lesson(sentence))
    assert found.sentence == sentence and found.cell == 0


@pytest.mark.parametrize(
    "sentence",
    [
        "On a GPU AMP is faster; on a CPU the cell prints which precision won.",
        "The verdict below says whether the pipeline was faster than the split.",
        "[NVIDIA's table](https://example.org/rn50) gives 2.5× for AMP on an A100.",
        "A 2 × 2 mesh of 4 processes; each 28×28 digit.",
        'What people write: "all-reduce runs at 40 GB/s, half speed".',
        "DDP starts one process per GPU.",
    ],
)
def test_a_sentence_that_covers_both_cases_cites_or_claims_nothing_passes(sentence):
    assert claims.unreviewed("99_test", lesson(sentence)) == []


def test_code_and_reviewed_sentences_are_not_claims():
    code = "Run `bench --faster 3x` and read its table."
    reviewed = "| the one-GPU `lr` on 8 GPUs, same batch per rank | 8× the global batch |"
    assert claims.unreviewed("02_distributed_data_parallel", lesson(code, reviewed)) == []


def test_no_lesson_asserts_what_its_cells_measure():
    """Each claim covers both cases, defers to the printed output, cites its figure, or is
    reviewed in labtools/claims.py with the reason no run can contradict it."""
    found = claims.every_lesson()
    assert not found, "claims a run may contradict:\n" + "\n".join(map(str, found))
