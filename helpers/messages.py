"""What the helpers say to a person, in the reader's language: standard gettext catalogs.

``_("text")`` returns the translation of ``text`` for the current language, or ``text`` itself
(English is the source and the default). The language is, first found:

1. ``MULTIGPU_LAB_LANG`` (``zh_CN``; ``en`` forces English);
2. the edition of the notebook a Jupyter kernel was started for: jupyter_server names that
   notebook in the kernel's ``JPY_SESSION_NAME``, and every translated notebook says its
   edition in its metadata (``multigpu_lab.edition``, written by labtools.i18n), so a Chinese
   notebook answers in Chinese wherever its file lies and whichever folder its kernel has moved
   to; the English notebooks say nothing, and the next rules decide;
3. the working folder: a process in ``notebooks/zh_CN/`` (or ``student/zh_CN/``, or any folder
   named after a catalog) answers in Chinese, whatever the machine's locale, because that is
   the notebook its reader chose (papermill and nbconvert start kernels without a session);
4. the system locale, as gettext reads it (``LANGUAGE``, ``LC_ALL``, ``LC_MESSAGES``, ``LANG``).

Catalogs: ``helpers/locale/<lang>/LC_MESSAGES/multigpu_lab.po`` (edited by translators) and the
``.mo`` compiled from it (committed, so running the kit needs no babel).
``python -m labtools.translate messages zh_CN`` re-extracts the strings from the helpers and the
notebooks' hints and reasons, updates the ``.po`` and compiles it (labtools.message_catalog;
babel, installed with the dev extra).
"""

from __future__ import annotations

import gettext
import json
import os
from functools import lru_cache
from pathlib import Path

LOCALE_DIR = Path(__file__).resolve().parent / "locale"
DOMAIN = "multigpu_lab"
LANG_ENV = "MULTIGPU_LAB_LANG"
SESSION_ENV = "JPY_SESSION_NAME"  # jupyter_server: the path of the notebook a kernel serves
META_KEY = "multigpu_lab"  # a notebook's metadata of this kit: {"edition": "zh_CN"}


def po_path(lang: str) -> Path:
    return LOCALE_DIR / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


@lru_cache(maxsize=32)
def _edition_of(cwd: str) -> str | None:
    """``zh_CN`` for a process working in a folder named after a catalog (notebooks/zh_CN/work)."""
    found = [
        p for p in Path(cwd).parts if p[:1].isalpha() and po_path(p).with_suffix(".mo").exists()
    ]
    return found[-1] if found else None


@lru_cache(maxsize=32)
def _notebook_edition(path: str, mtime_ns: int) -> str | None:
    """The ``edition`` a notebook file's metadata names, if a catalog exists for it.

    Keyed by modification time too: a notebook saved again is read again. Only the top-level
    metadata counts, and a file that is not a readable notebook has no edition.
    """
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f).get("metadata", {}).get(META_KEY, {})
    except (OSError, ValueError, AttributeError):
        return None
    lang = meta.get("edition") if isinstance(meta, dict) else None
    return lang if isinstance(lang, str) and po_path(lang).with_suffix(".mo").exists() else None


def session_edition() -> str | None:
    """The edition of the notebook this Jupyter kernel serves (``JPY_SESSION_NAME``), if any."""
    path = os.environ.get(SESSION_ENV, "")
    if not path.endswith(".ipynb"):
        return None
    try:
        found = _notebook_edition(path, os.stat(path).st_mtime_ns)
    except OSError:  # renamed or deleted since the kernel started
        found = None
    return found or _edition_of(os.path.dirname(path))  # an edition built before the metadata


def keep_edition() -> None:
    """Carry the edition's language past a change of working folder.

    helpers.params moves each run into a folder of its own; a kernel that started in
    notebooks/zh_CN/ keeps answering in Chinese, and so do the workers it starts (they inherit
    the variable).
    """
    lang = language()
    if lang:
        os.environ[LANG_ENV] = lang


def language() -> str | None:
    """The chosen language, or None to let gettext read the system locale."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working folder was deleted
        cwd = ""
    return os.environ.get(LANG_ENV) or session_edition() or _edition_of(cwd)


@lru_cache(maxsize=8)
def _catalog(lang: str | None, system: tuple[str | None, ...]) -> gettext.NullTranslations:
    languages = [lang] if lang else None  # None: gettext reads the environment itself
    return gettext.translation(DOMAIN, LOCALE_DIR, languages=languages, fallback=True)


def _(message: str) -> str:
    """``message`` in the reader's language (English when there is no translation)."""
    if not message:  # gettext("") is the catalog's header, never what a caller wants
        return message
    system = tuple(os.environ.get(v) for v in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"))
    return _catalog(language(), system).gettext(message)
