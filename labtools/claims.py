"""Prose that claims what a cell measures: find it before a learner reads it wrong.

A lesson's text must not assert an outcome its cells compute: on another machine (or this one
under load) the output may say the opposite, as it did in issue 44 ("here it cannot be faster"
above a measured 1.06x; "the bound no setting can beat" above 1.13 of it). A *claim* is a
sentence of a lesson's markdown that states a direction of speed (faster, slower, speed-up,
beats, cannot be faster) or quotes a speed figure (3x, 420 img/s, 40 GB/s). Each claim must
either cover both cases or defer to the output (a condition: "if", "when", "on a GPU", "on
CPU", "the cell prints ..."), or cite where its figure comes from (a link, "published",
"paper"), or be reviewed below with the reason it cannot be contradicted by a run.

    python -m labtools.claims          # every unreviewed claim, one per line (exit 1 if any)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import nbformat

from helpers.paths import NOTEBOOKS

DIRECTION = re.compile(
    r"\b(faster|slower|quicker|speeds? up|slows? down|speed-?ups?|slow-?downs?|outperforms?"
    r"|beats?|no setting can|cannot be (?:faster|slower)|reaches about)\b",
    re.IGNORECASE,
)
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?\s?(?:×|x\b|samples/s|img/s|images/s|tokens/s|[MG]i?B/s|TFLOPS)"
)
DIMENSIONS = re.compile(r"\b\d+(?:\s?[×x]\s?\d+)+\b")  # 28×28, a 2 × 2 mesh: sizes, not speeds
QUOTED = re.compile(r'"[^"]*"|“[^”]*”')  # what people write: a mistake quoted, not claimed
CODE = re.compile(r"```.*?```|`[^`]*`", re.DOTALL)
# Words that make a claim conditional on the machine or defer it to the printed output.
COVERED = re.compile(
    r"\b(if|when|whether|may|might|could|depends?|either|unless|prints?|printed|verdict"
    r"|says|predict|on (?:a |an |modern |NVIDIA )?(?:GPU|CPU)s?|with NCCL|goal)\b",
    re.IGNORECASE,
)
SOURCED = re.compile(r"\]\(https?://|\bpublished\b|\bpaper\b|\bdatasheet\b", re.IGNORECASE)

# Claims read and kept, by lesson and the sentence's first words: why no run can contradict them.
REVIEWED = {
    ("02_distributed_data_parallel", "Speed-up* is"): "a definition",
    ("02_distributed_data_parallel", "CODE builds each optimizer step"): "arithmetic: 4 x 1",
    ("02_distributed_data_parallel", "the one-GPU CODE on 8 GPUs"): "arithmetic of batches",
    ("03_mixed_precision", "Tensor Cores** (Volta"): "NVIDIA hardware, GPU-only",
    ("04_dataloader_tuning", "Common mistake: CODE"): "the mistake's own words",
    ("04_dataloader_tuning", "two common mistakes"): "names the mistakes",
    ("04_dataloader_tuning", "CODE times CODE first"): "what the tuner does, not an outcome",
    ("04_dataloader_tuning", "The tuned loader, built"): "what is measured, not an outcome",
    ("12_arithmetic_of_parallelism", "By the formulas"): "arithmetic: 3 against 2",
    ("12_arithmetic_of_parallelism", "collective times scatter"): "a symptom in a table",
    ("13_troubleshooting", "the first NCCL CODE hangs"): "NCCL_P2P_DISABLE's documented cost",
}


@dataclass(frozen=True)
class Claim:
    """One unreviewed claim: where it is and what it says."""

    stem: str
    cell: int
    sentence: str

    def __str__(self) -> str:
        return f"{self.stem} cell {self.cell}: {self.sentence[:160]}"


def sentences(markdown: str) -> Iterator[str]:
    """A cell's sentences, table rows and list items, code spans replaced by ``CODE``."""
    text = CODE.sub("CODE", markdown)
    for part in re.split(r"(?<=[.!?])\s+|\n(?=\s*[-*|>])|\n\n", text):
        if part.strip():
            yield part.strip()


def is_claim(sentence: str) -> bool:
    """A direction of speed or a speed figure, outside quotes and sizes."""
    plain = DIMENSIONS.sub("DIM", QUOTED.sub("QUOTE", sentence))
    return bool(DIRECTION.search(plain) or FIGURE.search(plain))


def unreviewed(stem: str, nb: nbformat.NotebookNode) -> list[Claim]:
    """The lesson's claims that neither cover both cases, nor cite, nor were reviewed."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in sentences(cell.source):
            if not is_claim(sentence) or COVERED.search(sentence) or SOURCED.search(sentence):
                continue
            words = sentence.lstrip("|->* ")  # a table row, a list item or a quote: its words
            if any(stem == s and words.startswith(p) for s, p in REVIEWED):
                continue
            found.append(Claim(stem, index, sentence))
    return found


def every_lesson() -> list[Claim]:
    """Every English lesson's unreviewed claims (the Chinese edition follows the English)."""
    return [
        claim
        for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
        for claim in unreviewed(path.stem, nbformat.read(path, as_version=4))
    ]


def main() -> int:
    claims = every_lesson()
    for claim in claims:
        print(claim)
    return 1 if claims else 0


if __name__ == "__main__":
    sys.exit(main())
