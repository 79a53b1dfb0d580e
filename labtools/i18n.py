"""Translated editions of the lessons, built from the English notebooks and never edited by hand.

The English notebooks stay the one source. A translation lives beside them in
``notebooks/i18n/<lang>/<stem>.json``: the text of each markdown cell, keyed by the cell's
stable ``id``, with a hash of the English source it translates. ``build`` copies everything
else (code cells, tags, the parameters cell, metadata) from the English notebook, so the two
editions cannot differ in what they run. When an English paragraph changes, its translation
turns *stale* and, like a fuzzy gettext entry, is not used: the edition shows the English text
under a banner that says so until the translation is refreshed. ``make sync`` writes the cells
waiting for a translator into the file's ``todo`` (so the change shows in review), and
``status`` lists them.

The command line is ``python -m labtools.translate`` (build, status, export, import,
messages).

A built notebook a reader has changed (run with outputs saved, edited) is kept, not
overwritten: ``build`` remembers what it wrote in ``notebooks/<lang>/.built.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from helpers.messages import META_KEY
from helpers.paths import NOTEBOOKS

TRANSLATIONS = NOTEBOOKS / "i18n"
MANIFEST = ".built.json"


class I18nError(Exception):
    """A translation or notebook that cannot be used as it is; the message says how to fix it."""


def english_hash(source: str) -> str:
    """What a translation remembers of the English it translates: enough to notice a change."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def english_stems() -> list[str]:
    """The English lessons, in order (the same list the runner executes)."""
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def read_english(stem: str, text: str | None = None) -> nbformat.NotebookNode:
    """The English notebook as stored (or as ``text``, its next version): nbformat would invent
    random ids for cells without one."""
    path = NOTEBOOKS / f"{stem}.ipynb"
    raw = json.loads(path.read_text() if text is None else text)
    for index, cell in enumerate(raw["cells"]):
        if not cell.get("id"):
            raise I18nError(
                f"{path}: cell {index} has no id, so no translation can point at it. Save the "
                "notebook with JupyterLab >= 3 (or nbformat.validator.normalize) to give it one."
            )
        cell["source"] = _source(cell)
    return nbformat.from_dict(raw)


# ---------------------------------------------------------------- translation files


def editions() -> list[str]:
    """The languages that have translations (``zh_CN``), besides the English source."""
    return sorted(p.name for p in TRANSLATIONS.glob("*") if any(p.glob("[0-9][0-9]_*.json")))


def translation_path(lang: str, stem: str) -> Path:
    return TRANSLATIONS / lang / f"{stem}.json"


def load(lang: str, stem: str) -> dict[str, dict[str, Any]]:
    """cell id -> {"en_sha256": hash of the English, "text": [translated lines]}."""
    path = translation_path(lang, stem)
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())["cells"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise I18nError(f"{path}: not a translation file ({exc}); restore it from git") from None


def translation_text(
    lang: str, stem: str, entries: dict[str, dict[str, Any]], nb: nbformat.NotebookNode
) -> str:
    """The translation file as stored: entries in the English notebook's cell order (stable,
    reviewable diffs) without those whose markdown cell is gone, then ``todo``: the cells whose
    translation is stale or missing, which the edition shows in English under a banner."""
    markdown = [cell for cell in nb.cells if cell.cell_type == "markdown"]
    cells = {cell.id: entries[cell.id] for cell in markdown if cell.id in entries}
    todo = {
        cell.id: "stale" if cell.id in cells else "missing"
        for cell in markdown
        if cells.get(cell.id, {}).get("en_sha256") != english_hash(cell.source)
    }
    about = (
        f"{lang} markdown of notebooks/{stem}.ipynb by cell id; edit it with "
        "python -m labtools.translate export/import (notebooks/i18n/README.md)"
    )
    data = {"about": about, "cells": cells, **({"todo": todo} if todo else {})}
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def save(lang: str, stem: str, entries: dict[str, dict[str, Any]], nb: nbformat.NotebookNode):
    path = translation_path(lang, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(translation_text(lang, stem, entries, nb))


def entry_for(cell: nbformat.NotebookNode, text: str) -> dict[str, Any]:
    return {"en_sha256": english_hash(cell.source), "text": text.split("\n")}


# ---------------------------------------------------------------- state and build


@dataclass
class NotebookState:
    """Which markdown cells of one notebook have a current translation."""

    stem: str
    fresh: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)  # entries whose cell is gone

    @property
    def complete(self) -> bool:
        return not (self.stale or self.missing)


def state_of(lang: str, stem: str) -> NotebookState:
    nb, entries = read_english(stem), load(lang, stem)
    state = NotebookState(stem)
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        entry = entries.get(cell.id)
        if entry is None:
            state.missing.append(cell.id)
        elif entry["en_sha256"] != english_hash(cell.source):
            state.stale.append(cell.id)
        else:
            state.fresh.append(cell.id)
    markdown = {c.id for c in nb.cells if c.cell_type == "markdown"}
    state.orphans = [cid for cid in entries if cid not in markdown]
    return state


# Above a markdown cell the edition shows in English: the translation is missing or stale.
BANNER = {
    "zh_CN": {
        "missing": "> ⚠️ **本段尚未翻译**，下面是英文原文。",
        "stale": "> ⚠️ **英文原文已更新，译文待更新**，下面是新的英文原文。",
    }
}


def with_banner(source: str, banner: str) -> str:
    """The English cell under ``banner``; a heading stays first, so the title reads as one."""
    head, _, rest = source.partition("\n")
    if head.startswith("#"):
        return f"{head}\n\n{banner}\n\n{rest.lstrip()}" if rest.strip() else f"{head}\n\n{banner}"
    return f"{banner}\n\n{source}"


LINK = re.compile(r"(\]\()(?!https?:|#|mailto:|/)([^)\s]+)")  # a markdown link to a file


def one_folder_down(source: str, lang: str) -> str:
    """Links written from notebooks/ (``notes/x.md``, ``../CONTRIBUTING.md``), made to work
    from the edition's folder, notebooks/<lang>/, one level down: they gain a ``../``, and a
    note translated as ``notes/x.<lang>.md`` is linked instead of the English one. A
    translation keeps the English link (its structure is checked against the English)."""

    def fix(link: re.Match) -> str:
        target, anchor = link[2].split("#")[0], link[2][len(link[2].split("#")[0]) :]
        localized = re.sub(r"\.md$", f".{lang}.md", target)
        if localized != target and (NOTEBOOKS / localized).exists():
            target = localized  # notes/x.md -> notes/x.zh_CN.md where the note is translated
        here, there = (os.path.normpath(NOTEBOOKS / f / target) for f in ("", lang))
        moved = os.path.exists(here) and not os.path.exists(there)
        return f"{link[1]}../{target}{anchor}" if moved else link[0]

    return LINK.sub(fix, source)


def translated(nb: nbformat.NotebookNode, entries: dict[str, dict[str, Any]], lang: str = ""):
    """A copy of ``nb`` whose markdown cells with a current translation read translated; the
    others keep the English under ``lang``'s banner (none for a language without one). Links to
    the kit's files are rewritten for the edition's folder."""
    out = copy.deepcopy(nb)
    banners = BANNER.get(lang, {})
    for cell in out.cells:
        if cell.cell_type != "markdown":
            continue
        entry = entries.get(cell.id)
        if entry and entry["en_sha256"] == english_hash(cell.source):
            cell.source = "\n".join(entry["text"])
        elif banner := banners.get("stale" if entry else "missing"):
            cell.source = with_banner(cell.source, banner)
        if lang:
            cell.source = one_folder_down(cell.source, lang)
    return out


def translated_notebook(lang: str, stem: str) -> nbformat.NotebookNode:
    """The English notebook ``stem`` with its current ``lang`` translations swapped in.

    Its metadata names the edition, which is how a Jupyter kernel serving it knows to answer in
    ``lang`` wherever the file is (helpers.messages).
    """
    nb = translated(read_english(stem), load(lang, stem), lang)
    nb.metadata.setdefault(META_KEY, {})["edition"] = lang
    return nb


def edition_dir(lang: str) -> Path:
    return NOTEBOOKS / lang


def _manifest(folder: Path) -> dict[str, str]:
    path = folder / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_one(lang: str, stem: str, out: Path | None = None, force: bool = False) -> str:
    """Write one translated notebook; returns "written", "unchanged" or "kept" (reader's edits)."""
    folder = out or edition_dir(lang)
    folder.mkdir(parents=True, exist_ok=True)
    text = nbformat.writes(translated_notebook(lang, stem))
    path, manifest = folder / f"{stem}.ipynb", _manifest(folder)
    if path.exists():
        current = path.read_text()
        if current == text:
            return "unchanged"
        if not force and manifest.get(path.name) != _digest(current):
            return "kept"
    path.write_text(text)
    manifest[path.name] = _digest(text)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return "written"


def edition_path(lang: str, stem: str, folder: Path | None = None) -> Path:
    """The translated notebook, built now if needed: what ``runner --lang`` executes.

    ``folder`` builds it elsewhere than notebooks/<lang>/ (name it ``<lang>`` too: the helpers
    then answer in that language, see helpers.messages).
    """
    if lang not in editions():
        raise I18nError(f"no translations for {lang!r} in {TRANSLATIONS}; have {editions()}")
    folder = folder or edition_dir(lang)
    if build_one(lang, stem, folder) == "kept":
        print(
            f"{lang}/{stem}.ipynb has your edits and was not rebuilt "
            f"(python -m labtools.translate build {lang} --force replaces it)"
        )
    return folder / f"{stem}.ipynb"


def build(lang: str, out: Path | None = None, force: bool = False) -> dict[str, str]:
    """Every lesson in ``lang``, into notebooks/<lang>/ (or ``out``); stem -> what happened."""
    return {stem: build_one(lang, stem, out, force) for stem in english_stems()}


# ---------------------------------------------------------------- status


def _first_line(nb: nbformat.NotebookNode, cell_id: str) -> str:
    cell = next(c for c in nb.cells if c.id == cell_id)
    line = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def status_report(lang: str) -> tuple[str, bool]:
    """A readable list of what to translate, and whether everything is current."""
    states = [state_of(lang, stem) for stem in english_stems()]
    lines = []
    for s in states:
        counts = f"{len(s.fresh)} translated, {len(s.stale)} stale, {len(s.missing)} missing"
        lines.append(
            f"{s.stem:34} {counts}" + (f", {len(s.orphans)} orphaned" if s.orphans else "")
        )
        nb = read_english(s.stem)
        lines += [
            f"    {kind:8} {cid:10} {_first_line(nb, cid)}"
            for kind, ids in (("stale", s.stale), ("missing", s.missing))
            for cid in ids
        ]
    complete = all(s.complete for s in states)
    if not complete:
        lines += [
            "",
            f"Translate: python -m labtools.translate export {lang} --todo > todo.md, edit "
            f"todo.md, then python -m labtools.translate import {lang} todo.md",
        ]
    if any(s.orphans for s in states):
        lines.append(f"Orphaned entries (their cell is gone): status {lang} --prune drops them")
    return "\n".join(lines), complete


def prune(lang: str) -> int:
    """Drop translations of cells that no longer exist; returns how many."""
    dropped = 0
    for stem in english_stems():
        orphans = state_of(lang, stem).orphans
        if orphans:
            entries = load(lang, stem)
            for cid in orphans:
                del entries[cid]
            save(lang, stem, entries, read_english(stem))
            dropped += len(orphans)
    return dropped


# ---------------------------------------------------------------- command line
