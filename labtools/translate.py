"""The translators' command line: build the editions, list what is stale, hand out worksheets.

    python -m labtools.translate build zh_CN             # notebooks/zh_CN/*.ipynb (make zh)
    python -m labtools.translate status zh_CN [--check]  # missing and stale cells, per notebook
    python -m labtools.translate export zh_CN --todo > todo.md  # a worksheet of what to do
    python -m labtools.translate export zh_CN 03 --cell ID      # one cell, to edit it
    python -m labtools.translate import zh_CN todo.md    # store the translated worksheet
    python -m labtools.translate messages zh_CN          # gettext: extract, update, compile

The editions' model is labtools.i18n, the worksheet format labtools.translation_worksheets,
the helpers' gettext catalog labtools.message_catalog.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from helpers.messages import po_path
from labtools import message_catalog, translation_worksheets
from labtools.i18n import I18nError, build, english_stems, prune, status_report


def _stems(prefixes: list[str]) -> list[str]:
    stems = english_stems()
    chosen = [s for s in stems if not prefixes or any(s.startswith(p) for p in prefixes)]
    if not chosen:
        raise I18nError(f"no notebook matches {prefixes}; have {stems}")
    return chosen


def _cmd_build(args: argparse.Namespace) -> int:
    done = build(args.lang, Path(args.out) if args.out else None, args.force)
    for stem, what in done.items():
        note = " (has your edits; --force replaces it)" if what == "kept" else ""
        print(f"{args.lang}/{stem}.ipynb: {what}{note}")
    _, complete = status_report(args.lang)
    if not complete:
        print(f"Some cells are still English: python -m labtools.translate status {args.lang}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    if args.prune:
        print(f"dropped {prune(args.lang)} orphaned entries")
    text, complete = status_report(args.lang)
    print(text)
    return 1 if args.check and not complete else 0


def _cmd_export(args: argparse.Namespace) -> int:
    sheet = translation_worksheets.export(args.lang, _stems(args.notebooks), args.todo, args.cell)
    sys.stdout.write(sheet)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    stored, skipped = translation_worksheets.import_worksheet(args.lang, text)
    print(f"stored {len(stored)} translation(s)")
    for name in skipped:
        print(f"skipped {name}: still the English text (or empty)")
    return 0


def _cmd_messages(args: argparse.Namespace) -> int:
    untranslated = message_catalog.update_catalog(args.lang)
    print(f"{po_path(args.lang)} updated and compiled; {len(untranslated)} untranslated")
    for msgid in untranslated:
        print(f"    {msgid[:90]!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m labtools.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, run, about: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=about)
        p.add_argument("lang", help="e.g. zh_CN")
        p.set_defaults(run=run)
        return p

    p = command("build", _cmd_build, "write notebooks/<lang>/*.ipynb")
    p.add_argument("--out", help="another folder (default notebooks/<lang>)")
    p.add_argument("--force", action="store_true", help="also replace notebooks you edited")
    p = command("status", _cmd_status, "list missing and stale translations")
    p.add_argument("--check", action="store_true", help="exit 1 unless everything is current")
    p.add_argument("--prune", action="store_true", help="drop entries whose cell is gone")
    p = command("export", _cmd_export, "print a worksheet of cells to translate")
    p.add_argument("notebooks", nargs="*", help="stems or number prefixes (default: all)")
    p.add_argument("--todo", action="store_true", help="only missing and stale cells")
    p.add_argument("--cell", help="only the markdown cell with this id")
    p = command("import", _cmd_import, "store a translated worksheet")
    p.add_argument("file", help="the worksheet, or - for stdin")
    command("messages", _cmd_messages, "gettext: extract strings, update the .po, compile .mo")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except I18nError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
