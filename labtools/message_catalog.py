"""The helpers' gettext catalogs, kept complete: extract, update, compile (babel).

``helpers.messages`` translates at run time from the compiled ``.mo``; this module writes it.
The messages are every ``_()`` call in helpers/ and labtools/, and the texts the notebooks'
shared code cells pass to a helper that translates them (TRANSLATED_ARGUMENTS). Run through
``python -m labtools.translate messages zh_CN``.
"""

from __future__ import annotations

import ast

from helpers.messages import DOMAIN, LOCALE_DIR, po_path
from helpers.paths import NOTEBOOKS
from labtools.layers import python_source

# Calls in the notebooks' shared code cells whose text argument is looked up at run time:
# (module name, functions, keyword) -> helpers.exercise's hints, helpers.params.adjusted's reasons.
TRANSLATED_ARGUMENTS = (
    ("exercise", {"equal", "function", "report", "job"}, "hint"),
    ("params", {"adjusted"}, "why"),
)


def notebook_hints() -> list[tuple[str, int, str]]:
    """(notebook file, cell number, text) for every ``exercise.*(..., hint="...")`` and
    ``params.adjusted(..., why="...")`` in a lesson.

    The texts are written in the English code cells, which both editions share; the helper
    looks each one up at run time, so the translated edition shows the translated text.
    """
    import nbformat

    found = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != "code" or cell.source.startswith("%%"):
                continue
            try:
                tree = ast.parse(python_source(cell.source))
            except SyntaxError:
                continue
            found += [
                (f"notebooks/{path.name}", index, kw.value.value)
                for node in ast.walk(tree)
                if (keyword := _translated_keyword(node))
                for kw in node.keywords
                if kw.arg == keyword and isinstance(kw.value, ast.Constant)
            ]
    return found


def _translated_keyword(node: ast.AST) -> str | None:
    """The keyword whose text a call of TRANSLATED_ARGUMENTS translates, else None."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    ):
        return None
    return next(
        (
            keyword
            for module, functions, keyword in TRANSLATED_ARGUMENTS
            if node.func.value.id == module and node.func.attr in functions
        ),
        None,
    )


def template():
    """A fresh babel catalog of every message: ``_()`` calls in helpers/ and labtools/, then
    the notebooks' hints and reasons."""
    from babel.messages.catalog import Catalog
    from babel.messages.extract import extract_from_file

    catalog = Catalog(project="multigpu-lab", charset="utf-8")
    root = LOCALE_DIR.parent.parent
    for path in sorted([*root.glob("helpers/*.py"), *root.glob("labtools/*.py")]):
        for lineno, message, comments, _context in extract_from_file(
            "python", path, keywords={"_": None}, comment_tags=("TRANSLATORS:",)
        ):
            where = path.relative_to(root).as_posix()
            catalog.add(message, locations=[(where, lineno)], auto_comments=comments)
    for where, cell, hint in notebook_hints():
        catalog.add(hint, locations=[(where, cell)], auto_comments=["exercise hint (cell number)"])
    return catalog


def read_catalog(lang: str):
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    path = po_path(lang)
    if not path.exists():
        return Catalog(
            locale=lang,
            project="multigpu-lab",
            version="0.1",
            charset="utf-8",
            copyright_holder="the Multi-GPU Lab authors",
            fuzzy=False,
            last_translator="Multi-GPU Lab",
            language_team=lang,
        )
    with path.open("rb") as f:
        return read_po(f, locale=lang, domain=DOMAIN)


def todo(catalog) -> list[str]:
    """Messages without a usable translation: empty, or fuzzy (gettext ignores fuzzy ones)."""
    return [m.id for m in catalog if m.id and (not m.string or m.fuzzy)]


def compiled(lang: str) -> tuple[bytes, bytes, list[str]]:
    """The .po and .mo as ``update_catalog`` writes them, and the messages still to translate:
    the stored translations merged with freshly extracted messages (babel keeps a changed
    message's old translation as fuzzy, which gettext ignores: English shows until reviewed)."""
    from io import BytesIO

    from babel.messages.mofile import write_mo
    from babel.messages.pofile import write_po

    catalog, fresh = read_catalog(lang), template()
    fresh.creation_date = catalog.creation_date  # stable headers: clean diffs and merges
    catalog.update(fresh)
    po, mo = BytesIO(), BytesIO()
    write_po(po, catalog, width=0, ignore_obsolete=True, include_lineno=False)
    write_mo(mo, catalog)
    return po.getvalue(), mo.getvalue(), todo(catalog)


def update_catalog(lang: str) -> list[str]:
    """Merge freshly extracted messages into the .po, compile the .mo; returns what is to do."""
    po, mo, untranslated = compiled(lang)
    path = po_path(lang)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(po)
    path.with_suffix(".mo").write_bytes(mo)
    return untranslated
