"""One source, one refresh: ``make sync`` rewrites every copy derived from the lessons.

    python -m labtools.sync           # rewrite what is stale; lists what waits for a translator
    python -m labtools.sync --check   # list what is stale and exit 1 (tests/test_sync.py)

The English notebooks and notebooks/catalog.json are the sources. Derived from them:

- the header's ``**Time:**`` line of each lesson (and its translation's ``**用时：**``), from the
  quick-mode seconds measured in catalog.json (``python -m labtools.catalog runs/<time>``);
- each translation file's ``todo``: the markdown cells whose English changed or is new; the
  edition shows them in English under a banner until a translator refreshes them;
- the gettext catalogs (helpers/locale/<lang>/LC_MESSAGES/*.po, .mo) from every ``_()`` call and
  the notebooks' hints;
- the committed scripts (scripts/ddp_*.py) from their ``%%writefile`` cells;
- the start page (notebooks/README.md) from catalog.json;
- the nbval recordings (tests/nbval/<stem>.json): a lesson whose checked cells changed runs
  once in quick mode to record their outputs again (the only slow step, and only when needed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

from helpers.messages import po_path
from helpers.paths import NOTEBOOKS, REPO_ROOT
from labtools import catalog, exported_scripts, i18n, message_catalog, reading, recordings

TIME_LINE = {"en": "**Time:**", "zh_CN": "**用时：**"}


def _about(seconds: float, lang: str) -> str:
    """A header's rounding: 5 s steps under 100 s, tenths of a minute above."""
    if seconds < 100:
        value, unit = f"{max(5, round(seconds / 5) * 5)}", {"en": "s", "zh_CN": "秒"}
    else:
        value, unit = f"{seconds / 60:.1f}", {"en": "min", "zh_CN": "分钟"}
    return f"{value} {unit.get(lang, unit['en'])}"


def time_line(entry: dict[str, Any], lang: str, reading_min: int | None = None) -> str | None:
    """The header line: the estimated reading time (``reading.reading_minutes``) and the
    measured machine time with the machine named, or None while nothing is measured."""
    measured = entry.get("measured") or {}
    quick, full = measured.get("quick_s"), measured.get("full_s")
    if quick is None or lang not in TIME_LINE:
        return None
    machine = measured.get("on", "").split(" (")[0]  # "2 CPU cores, no GPU"
    if lang == "en":  # as short as the header's 150 words allow: measured figures, rounded
        rest = _about(full, lang) if full else "longer"
        read = f"reading about {reading_min} min; " if reading_min else ""
        return f"**Time:** {read}quick run {_about(quick, lang)} on {machine}; full run {rest}."
    cores = re.fullmatch(r"(\d+) CPU cores, no GPU", machine)
    machine = f"{cores[1]} 个 CPU 核心、无 GPU 的机器" if cores else machine
    rest = f"约 {_about(full, lang)}" if full else "更久"
    read = f"阅读约 {reading_min} 分钟；" if reading_min else ""
    return f"**用时：** {read}快速运行约 {_about(quick, lang)}（{machine}）；完整运行{rest}。"


def with_line(source: str, prefix: str, line: str | None) -> str:
    """``source`` with its line starting ``prefix`` replaced by ``line`` (appended if none)."""
    if line is None:
        return source
    lines = source.split("\n")
    at = next((i for i, text in enumerate(lines) if text.startswith(prefix)), None)
    if at is None:
        return f"{source.rstrip()}\n{line}"
    lines[at] = line
    return "\n".join(lines)


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode()


def _lesson_copies(stem: str) -> dict[Path, bytes]:
    """The notebook with its header time line, and each translation file with that line and
    its todo: a translation that was current before the line changed stays current."""
    path = NOTEBOOKS / f"{stem}.ipynb"
    raw = json.loads(path.read_text())
    entry = catalog.catalog_entry(stem)
    first = raw["cells"][0]
    old = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    minutes = reading.reading_minutes(reading.reading(nbformat.reads(path.read_text(), 4)))
    new = with_line(old, TIME_LINE["en"], time_line(entry, "en", minutes))
    first["source"] = new.splitlines(keepends=True)
    text = _json(raw)
    copies = {path: text}
    nb = i18n.read_english(stem, text.decode())
    for lang in i18n.editions():
        entries = i18n.load(lang, stem)
        translation = entries.get(first["id"])
        if new != old and translation and translation["en_sha256"] == i18n.english_hash(old):
            source = with_line(
                "\n".join(translation["text"]), TIME_LINE[lang], time_line(entry, lang, minutes)
            )
            entries[first["id"]] = {"en_sha256": i18n.english_hash(new), "text": source.split("\n")}
        copies[i18n.translation_path(lang, stem)] = i18n.translation_text(
            lang, stem, entries, nb
        ).encode()
    return copies


def derived_copies() -> dict[Path, bytes]:
    """Every derived file as its sources make it now (the nbval recordings aside)."""
    copies: dict[Path, bytes] = {}
    for stem in i18n.english_stems():
        copies.update(_lesson_copies(stem))
    for lang in i18n.editions():
        po, mo, _ = message_catalog.compiled(lang)
        copies[po_path(lang)] = po
        copies[po_path(lang).with_suffix(".mo")] = mo
    for name in exported_scripts.EXPORTED:
        copies[REPO_ROOT / name] = exported_scripts.exported_text(name).encode()
    copies[catalog.START_PAGE] = catalog.start_page().encode()
    return copies


def _differing() -> list[tuple[Path, bytes]]:
    """The derived files whose content on disk is not what their sources make now."""
    return [
        (path, data)
        for path, data in derived_copies().items()
        if not path.exists() or path.read_bytes() != data
    ]


def stale_copies() -> list[str]:
    """What ``make sync`` would rewrite, as repository paths (a lesson's recording by name)."""
    stale = [path.relative_to(REPO_ROOT).as_posix() for path, _ in _differing()]
    return stale + [f"tests/nbval/{stem}.json" for stem in recordings.stale_recordings()]


def sync() -> list[str]:
    """Rewrite every stale derived copy; the paths written. A copy can read another (the start
    page reads the translations' titles), so it repeats until nothing changes."""
    written: list[str] = []
    for _ in range(3):
        changed = _differing()
        if not changed:
            break
        for path, data in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            written.append(path.relative_to(REPO_ROOT).as_posix())
    for stem in recordings.stale_recordings():
        print(f"recording the checked cells of {stem} (one quick-mode run)...", flush=True)
        written.append(recordings.record(stem).relative_to(REPO_ROOT).as_posix())
    return list(dict.fromkeys(written))


def waiting_for_translators() -> list[str]:
    """What the editions show in English for now: a line per notebook and catalog."""
    lines = []
    for lang in i18n.editions():
        for stem in i18n.english_stems():
            state = i18n.state_of(lang, stem)
            if not state.complete:
                lines.append(
                    f"{lang}/{stem}: {len(state.stale)} stale, {len(state.missing)} missing "
                    f"(python -m labtools.translate export {lang} {stem[:2]} --todo > todo.md)"
                )
        untranslated = message_catalog.compiled(lang)[2]
        if untranslated:
            lines.append(
                f"{lang} messages: {len(untranslated)} to translate in "
                f"{po_path(lang).relative_to(REPO_ROOT)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m labtools.sync",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="list stale copies, exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_copies()
        for path in stale:
            print(f"stale: {path}")
        print("run `make sync`" if stale else "every derived copy is current")
        return 1 if stale else 0
    written = sync()
    print("\n".join(f"wrote {path}" for path in written) or "every derived copy was current")
    todo = waiting_for_translators()
    if todo:
        print(
            "\nShown in English until translated (a paragraph under a banner):\n  "
            + "\n  ".join(todo)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
