"""Translation worksheets: the markdown file a translator edits, one block per notebook cell.

``python -m labtools.translate export zh_CN --todo`` writes one; ``import`` stores it. Each block
starts with a marker naming the cell, ``<!-- i18n zh_CN 10_pipeline_parallel/1a2b3c4d: stale -->``,
and holds the cell's current translation (or its English, to be replaced). A stale block also
shows the English as it reads now, in a comment, above the old translation.
"""

from __future__ import annotations

import re

from labtools import i18n

_MARKER = re.compile(r"^<!-- i18n (?P<lang>\S+) (?P<stem>[^/\s]+)/(?P<cell>\S+?)(?:: \w+)? -->$")


def export(lang: str, stems: list[str], todo: bool = False, cell: str | None = None) -> str:
    """A markdown worksheet: one block per cell, holding its translation (or the English).

    A stale block also shows the new English in a comment, above the old translation.
    """
    blocks = []
    for stem in stems:
        nb, entries = i18n.read_english(stem), i18n.load(lang, stem)
        state = i18n.state_of(lang, stem)
        wanted = state.stale + state.missing if todo else state.fresh + state.stale + state.missing
        for c in nb.cells:
            if c.id not in wanted or (cell and c.id != cell):
                continue
            kind = "stale" if c.id in state.stale else "missing" if c.id in state.missing else "ok"
            head = [f"<!-- i18n {lang} {stem}/{c.id}: {kind} -->"]
            if kind == "stale":
                head += ["<!-- English now:", c.source.replace("-->", "--\u200b>"), "-->"]
            body = "\n".join(entries[c.id]["text"]) if c.id in entries else c.source
            blocks.append("\n".join([*head, body]))
    if cell and not blocks:
        raise i18n.I18nError(f"no markdown cell {cell!r} in {stems}")
    return "\n\n".join(blocks) + "\n"


def parse_worksheet(text: str) -> list[tuple[str, str, str, str]]:
    """(lang, stem, cell id, translated text) for each block; the English comment is dropped."""
    blocks: list[tuple[str, str, str, list[str]]] = []
    in_comment = False
    for line in text.splitlines():
        marker = _MARKER.match(line)
        if marker:
            blocks.append((marker["lang"], marker["stem"], marker["cell"], []))
            in_comment = False
        elif blocks and not blocks[-1][3] and line == "<!-- English now:":
            in_comment = True
        elif in_comment:
            in_comment = line != "-->"
        elif blocks:
            blocks[-1][3].append(line)
        elif line.strip():
            raise i18n.I18nError(f"text before the first '<!-- i18n ... -->' marker: {line[:60]!r}")
    return [(lang, stem, cid, "\n".join(body).strip("\n")) for lang, stem, cid, body in blocks]


def import_worksheet(lang: str, text: str) -> tuple[list[str], list[str]]:
    """Store every translated block; returns (stored, skipped because still English)."""
    stored, skipped, by_stem = [], [], {}
    for block_lang, stem, cid, body in parse_worksheet(text):
        if block_lang != lang:
            raise i18n.I18nError(f"{stem}/{cid} is marked {block_lang}, not {lang}")
        if stem not in by_stem:
            if stem not in i18n.english_stems():
                raise i18n.I18nError(f"{stem}: no notebooks/{stem}.ipynb")
            by_stem[stem] = (i18n.read_english(stem), i18n.load(lang, stem))
        nb, entries = by_stem[stem]
        cell = next((c for c in nb.cells if c.id == cid), None)
        if cell is None or cell.cell_type != "markdown":
            raise i18n.I18nError(f"{stem}: no markdown cell with id {cid!r} (was it deleted?)")
        if body.strip() == cell.source.strip() or not body.strip():
            skipped.append(f"{stem}/{cid}")
            continue
        entries[cid] = i18n.entry_for(cell, body)
        stored.append(f"{stem}/{cid}")
    for stem, (nb, entries) in by_stem.items():
        i18n.save(lang, stem, entries, nb)
    return stored, skipped
