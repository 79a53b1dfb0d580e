"""JupyterLab's post-save hook for ``make lab``: a saved run leaves ``git status`` clean.

.gitattributes sends every notebook through nbstripout's clean filter (``make setup`` defines it),
so git never sees a run's outputs. But git trusts the file size it keeps in its index: a notebook
saved with outputs is larger, so ``git status`` lists it as modified without running the filter,
and ``git pull`` of an update to it refuses ("local changes would be overwritten"). After each
save this hook records the new size in the index, only when the filtered notebook is exactly the
committed one (``git diff --quiet``): it stages nothing, and a learner's own edit is left alone.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def refresh_git_index(model: dict[str, Any], os_path: str, **_: Any) -> None:
    """``ContentsManager.post_save_hook``: refresh the index entry of a saved, unchanged notebook.

    Outside a git checkout, for other files, or when git is missing, it does nothing: a save
    must never fail because of it."""
    if model.get("type") != "notebook":
        return
    path = Path(os_path)
    try:
        unchanged = subprocess.run(
            ["git", "diff", "--quiet", "--", path.name], cwd=path.parent, timeout=60
        )
        if unchanged.returncode == 0:  # 1: a real change; 128 and up: not a checkout
            subprocess.run(
                ["git", "update-index", "-q", "--", path.name],
                cwd=path.parent,
                capture_output=True,
                timeout=60,
            )
    except (OSError, subprocess.TimeoutExpired):
        return
