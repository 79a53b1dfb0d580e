"""The kit's folders, said once: every module that needs one imports it from here.

Paths are relative to this checkout, never to the current directory: a notebook runs with
notebooks/ as its working directory, papermill and the tests from elsewhere.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
