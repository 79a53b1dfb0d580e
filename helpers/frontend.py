"""What the notebook's front end can show: live widgets, or only text and pictures.

ipywidgets are drawn by a Jupyter front end (JupyterLab, Notebook 7). Under papermill, nbconvert
or nbval nobody draws them: a widget would be saved as a model that shows as nothing, or as
``HBox(children=...)``. So the kit's interactive pieces (``helpers.live``, ``helpers.explorer``)
ask here first, and print a text summary when widgets would not be seen.
"""

from __future__ import annotations

import os

ENV = "MULTIGPU_LAB_WIDGETS"  # "1" or "0" forces the answer, e.g. for VS Code or a test


def widgets_shown() -> bool:
    """True in a kernel a Jupyter server started for a notebook, where widgets are drawn.

    jupyter_server gives the kernels it starts for a notebook ``JPY_SESSION_NAME`` (the
    notebook's path); papermill and nbval start their kernels without it, and plain Python or
    pytest has no kernel at all.
    """
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{ENV}={forced!r}: set it to 1 (draw widgets) or 0 (print text)")
        return forced == "1"
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return getattr(shell, "kernel", None) is not None and bool(os.environ.get("JPY_SESSION_NAME"))
