"""A real JupyterLab driven by a real browser: what a learner sees when they press Run All.

papermill and nbval execute notebooks without a front end, so they cannot notice a tqdm bar
that shows as text because the widget manager is missing, a plot that never appears, or a
notebook that only works when run from ``notebooks/``. This module starts JupyterLab on
127.0.0.1 with throwaway config, settings and workspace folders, drives Debian's ``chromium``
through Playwright, runs each notebook from the menu, and reports what it saw. Used by
``tests/test_browser.py``; everything it starts is ended by the context managers, also when a
check fails.

Traps met with JupyterLab 4.6, and what this module does about them:
- error outputs render with the same stderr MIME type as ordinary stderr, so errors are read
  from the saved notebook model (``output_type == "error"``) and from IPython's traceback
  header in the page, never from the MIME type;
- the toolbar says "idle" before any kernel exists, so readiness is the status bar showing
  the kernel's display name and "Idle";
- prompts left from an earlier run look finished, so outputs are cleared before Run All;
- a notebook reuses the kernel of the session at its path, so the session is deleted after
  each notebook and the next one starts a fresh kernel;
- a slider of ipywidgets 8 is a noUiSlider: it moves with the arrow keys on its focused handle,
  whose aria-valuenow/-max say which way is left; the kit's explorers redraw on release, so
  the new figure is waited for until the summary under it changes.
"""

from __future__ import annotations

import gettext
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from helpers.env import free_port
from helpers.procs import descendants, is_alive, kill_tree

# Where the screenshots and the notebooks as the browser saved them go (runs/ is git-ignored).
OUT_ENV = "MULTIGPU_LAB_BROWSER_OUT"
CHROMIUM_ENV = "MULTIGPU_LAB_CHROMIUM"  # a Chromium binary elsewhere than Debian's
# Debian's real binary first: /usr/bin/chromium is a shell wrapper that adds its own flags.
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root in a container, where Chromium's sandbox cannot start
    "--disable-dev-shm-usage",  # Docker's 64 MB /dev/shm crashes tabs; use /tmp
    "--disable-background-networking",
    "--disable-sync",
    "--disable-component-update",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
]
# User settings in the throwaway settings folder: render every cell (the default windowing
# leaves cells out of view out of the page, so their widgets and plots could not be checked),
# and no news or update checks, whose notification would also cover the notebook.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
VIEWPORT = {"width": 1280, "height": 900}
KERNEL_ITEM = 'span.jp-StatusBar-TextItem[title^="Change kernel"]'  # "<kernel> | Idle"
MENU_ITEM = "#jp-MainMenu .lm-MenuBar-item"
DIRTY_TAB = "#jp-main-dock-panel .lm-TabBar-tab.jp-mod-dirty"  # unsaved changes
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# IPython's header on an error output ("KeyError     Traceback (most recent call last)");
# a traceback a cell merely prints (a worker's, say) starts "Traceback (...):" on its own line.
IPYTHON_TRACEBACK = re.compile(r"\w\s{2,}Traceback \(most recent call last\)")
TQDM_IMPORT = re.compile(r"^\s*(from tqdm[\w.]* import|import tqdm)", re.MULTILINE)
TQDM_TEXT = re.compile(r"\d+%\|.*\|")  # a bar's text form: " 45%|████▌     | 9/20 [...]"
WIDGET_FAILED = ("Error displaying widget", "Loading widget...", "model not found")

# The kit's own widgets (helpers.explorer, helpers.live) carry these classes.
EXPLORER = ".jp-NotebookPanel:not(.lm-mod-hidden) .mgl-explorer"
LIVE_STOP = ".jp-NotebookPanel:not(.lm-mod-hidden) .mgl-live button"
FINAL_BAR = re.compile(r"\b(\d+)/\1\b")  # a rank bar's label at the end: "62/62 steps" (步)

# A rendered ipywidgets progress bar (tqdm.auto's bar in a notebook): hprogress in
# ipywidgets 8, progress in 7.
PROGRESS = ", ".join(
    f".jp-OutputArea-output .jupyter-widgets.{c}"
    for c in ("widget-hprogress", "widget-vprogress", "widget-progress")
)
# Everything the page knows about each cell, in notebook order.
CELLS_JS = """
(PROGRESS) => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  return [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map(c => {
    const outs = [...c.querySelectorAll('.jp-OutputArea-output')];
    const imgs = [...c.querySelectorAll('.jp-OutputArea-output img')];
    const prompt = c.querySelector('.jp-InputArea-prompt');
    return {
      code: c.classList.contains('jp-CodeCell'),
      prompt: prompt ? prompt.textContent.trim() : '',
      text: outs.map(o => o.innerText).join('\\n').slice(0, 20000),
      progress: c.querySelectorAll(PROGRESS).length,
      widgets: c.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
      images: imgs.length,
      images_shown: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
      explorers: c.querySelectorAll('.mgl-explorer').length,
      live: [...c.querySelectorAll('.mgl-live .mgl-status')].map(v => v.innerText),
      rank_bars: [...c.querySelectorAll('.mgl-live .mgl-rank-bar')].map(r => r.innerText),
    };
  });
}
"""

# Widgets can be gone by the end: tqdm's ``leave=False`` closes its bar when the loop ends. So
# an observer, installed before Run All, keeps the most widgets and bars each cell ever showed.
WATCH_WIDGETS_JS = """
(PROGRESS) => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const notebook = panel.querySelector('.jp-Notebook');
  const seen = window.__widgetsSeen = {};
  const note = (cell) => {
    const i = [...notebook.querySelectorAll('.jp-Cell')].indexOf(cell);
    const s = seen[i] = seen[i] || {widgets: 0, progress: 0};
    s.widgets = Math.max(s.widgets,
      cell.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length);
    s.progress = Math.max(s.progress, cell.querySelectorAll(PROGRESS).length);
  };
  new MutationObserver(records => {
    for (const r of records) for (const n of r.addedNodes) {
      if (n.nodeType !== 1) continue;
      if (!(n.matches('.jupyter-widgets') || n.querySelector('.jupyter-widgets'))) continue;
      const cell = n.closest('.jp-Cell');
      if (cell) note(cell);
    }
  }).observe(notebook, {childList: true, subtree: true});
}
"""


# Which characters the page can draw: each one drawn on a canvas against a character no font
# has (a private-use code point), which every browser draws as its missing-glyph box or not at
# all; a character drawn the same way has no font here either (the boxes of a screenshot).
GLYPHS_JS = """
(chars) => {
  const draw = (text) => {
    const canvas = document.createElement('canvas');
    canvas.width = 72; canvas.height = 72;
    const g = canvas.getContext('2d');
    g.font = '48px sans-serif'; g.fillStyle = '#000'; g.textBaseline = 'top';
    g.fillText(text, 8, 8);
    return canvas.toDataURL();
  };
  const missing = draw(String.fromCodePoint(0x10FFFD));
  return Object.fromEntries(chars.map(ch => [ch, draw(ch) !== missing]));
}
"""


def drawable(page: Any, chars: list[str]) -> dict[str, bool]:
    """For each character, whether the browser has a font that draws it (GLYPHS_JS)."""
    return page.evaluate(GLYPHS_JS, chars)


def in_every_edition(message: str) -> set[str]:
    """``message`` as the English source and every helpers catalog say it: the live view's
    words as the page shows them in any edition."""
    from helpers import messages

    langs = [p.name for p in messages.LOCALE_DIR.iterdir() if p.is_dir()]
    found = {message}
    for lang in langs:
        catalog = gettext.translation(messages.DOMAIN, messages.LOCALE_DIR, [lang], fallback=True)
        found.add(catalog.gettext(message))
    return found


RUNNING = tuple(f"· {word} ·" for word in in_every_edition("running"))


def find_chromium() -> str | None:
    """The Chromium to drive: $MULTIGPU_LAB_CHROMIUM, else Debian's package (see
    scripts/install-chromium.sh); None when there is none."""
    for name in (os.environ.get(CHROMIUM_ENV), *CHROMIUM_CANDIDATES):
        if name and (found := shutil.which(name)):
            return found
    return None


def output_folder(repo_root: Path) -> Path:
    """runs/browser/ unless $MULTIGPU_LAB_BROWSER_OUT says otherwise; CI can keep it."""
    return Path(os.environ.get(OUT_ENV) or repo_root / "runs" / "browser").resolve()


def uses_tqdm(nb: nbformat.NotebookNode) -> bool:
    """A notebook whose kernel imports tqdm must show a progress bar as a widget (a script a
    cell writes with %%writefile runs elsewhere, so its tqdm does not count)."""
    return any(
        c.cell_type == "code"
        and not c.source.lstrip().startswith("%%writefile")
        and TQDM_IMPORT.search(c.source)
        for c in nb.cells
    )


def prepare_copy(source: Path, folder: Path, out_dir: Path, kernel: str) -> Path:
    """Copy a notebook into the lab's throwaway root, set to quick mode.

    The `parameters` cell keeps its knobs and gains ``out_dir`` (inside the throwaway folder)
    and ``quick = True``, as papermill would inject them; the kernelspec is the kit's, so the
    kernel is the venv's python. The copy sits in a ``notebooks/`` folder of its own, so the
    lessons' relative paths (``work/``, ``../runs``) land in the throwaway folder too.
    """
    nb = nbformat.read(source, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(params) != 1:
        raise ValueError(f"{source.name}: needs exactly one cell tagged 'parameters'")
    params[0].source = (
        f"{params[0].source.rstrip()}\n\n# set by tests/test_browser.py\n"
        f"out_dir = {str(out_dir)!r}\nquick = True\n"
    )
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(kernel)
    nb.metadata["kernelspec"] = {
        "name": kernel,
        "display_name": spec.display_name,
        "language": spec.language,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / source.name
    nbformat.write(nb, path)
    return path


@dataclass
class NotebookRun:
    """What the browser saw of one notebook after Run All, and the model it saved."""

    name: str
    seconds: float
    finished: bool  # every queued cell ran, or the run stopped at an error
    uses_tqdm: bool
    cells: list[dict[str, Any]]  # from the page (CELLS_JS), in notebook order; widget and
    # progress counts are the most the cell ever showed (a bar may close when its loop ends)
    model: nbformat.NotebookNode | None  # the notebook as JupyterLab saved it
    screenshot: Path
    kernel: str = ""  # the kernelspec name of the session that ran it
    page_errors: list[str] = field(default_factory=list)
    explorers: list[dict[str, Any]] = field(default_factory=list)  # each one moved (_nudge)

    def count(self, key: str) -> int:
        """How many of a kind of widget the page shows at the end, over all cells."""
        return sum(len(c[key]) if isinstance(c[key], list) else c[key] for c in self.cells)

    def problems(self, expect_kernel: str | None = None) -> list[str]:
        """Everything a learner would call broken; empty when the notebook ran cleanly."""
        found: list[str] = []
        if not self.finished:
            found.append(f"Run All did not finish within its time budget ({self.seconds:.0f} s)")
        if expect_kernel and self.kernel != expect_kernel:
            found.append(f"ran on kernel {self.kernel!r}, expected {expect_kernel!r}")
        if self.model is None:
            return [*found, "JupyterLab did not save the notebook, so its model was not read"]
        code = [(i, c) for i, c in enumerate(self.model.cells) if c.cell_type == "code"]
        for i, cell in code:
            tags = cell.metadata.get("tags", [])
            for out in cell.get("outputs", []):
                if out.output_type == "error" and "raises-exception" not in tags:
                    found.append(f"cell {i} raised {out.ename}: {out.evalue}")
        never = [i for i, c in code if c.execution_count is None and c.source.strip()]
        if never:
            found.append(f"cells {never} never ran")
        if len(self.cells) != len(self.model.cells):
            found.append(
                f"the page shows {len(self.cells)} cells, the model has {len(self.model.cells)}"
            )
            return found
        for i, (seen, cell) in enumerate(zip(self.cells, self.model.cells, strict=True)):
            tags = cell.metadata.get("tags", [])
            if seen["prompt"].startswith("[*]"):
                found.append(f"cell {i} still shows [*] (queued or running)")
            if IPYTHON_TRACEBACK.search(seen["text"]) and "raises-exception" not in tags:
                found.append(f"cell {i} shows a traceback on the page")
            if any(s in seen["text"] for s in WIDGET_FAILED):
                found.append(f"cell {i}: a widget failed to render")
            views = [o.data for o in cell.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
            bars = sum(bool(TQDM_TEXT.search(v.get("text/plain", ""))) for v in views)
            if views and not seen["widgets"]:
                found.append(f"cell {i} has {len(views)} widget output(s), none ever rendered")
            elif seen["progress"] < bars:
                found.append(
                    f"cell {i}: {bars} tqdm bar(s), {seen['progress']} rendered as widgets"
                )
            elif seen.get("progress_end", seen["progress"]) < bars:
                found.append(
                    f"cell {i}: {bars} tqdm bar(s), only {seen['progress_end']} left "
                    "on screen at the end (leave=True keeps a bar)"
                )
            for status in seen.get("live", []):
                if any(word in status for word in RUNNING):
                    found.append(f"cell {i}: its torchrun view still says running: {status}")
                elif "✓" in status and not all(map(FINAL_BAR.search, seen["rank_bars"])):
                    found.append(
                        f"cell {i}: a finished job's bars lost their final figures: "
                        f"{seen['rank_bars']}"
                    )
            if seen["images"] != seen["images_shown"]:
                found.append(
                    f"cell {i}: {seen['images'] - seen['images_shown']} image(s) did not load"
                )
        if self.uses_tqdm and not sum(c["progress"] for c in self.cells):
            found.append("the notebook uses tqdm but no progress bar rendered as a widget")
        if not sum(c["images_shown"] for c in self.cells):
            found.append("no plot appeared in any output")
        return found


class LabError(RuntimeError):
    """The JupyterLab server answered a REST call with an error."""


class Lab:
    """A JupyterLab server on 127.0.0.1 serving a throwaway root, and its REST API."""

    def __init__(self, root: Path, state: Path):
        self.root = root
        self.state = state  # config, settings, workspaces, runtime files, server log
        self.token = secrets.token_hex(16)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        """Throwaway Jupyter folders; the venv's tools first on PATH for the kernels."""
        dirs = {name: self.state / name for name in ("config", "settings", "ws", "runtime")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        for plugin, values in LAB_SETTINGS.items():
            path = dirs["settings"] / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(dirs["ws"]),
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, timeout: float = 90.0, attempts: int = 3) -> None:
        """Start the server on a free port (port retries off: the port is the one asked for);
        a port taken in between is tried again with another."""
        env = self._env()
        for attempt in range(attempts):
            self.port = free_port()
            argv = [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}",
                "--ServerApp.terminals_enabled=False",
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
            ]
            if hasattr(os, "geteuid") and os.geteuid() == 0:
                argv.append("--allow-root")  # CI containers run as root
            log = (self.state / f"server-{attempt}.log").open("w")
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )
            log.close()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.api("GET", "/api/status")
                    return
                except OSError:
                    time.sleep(0.3)
            if self.proc.poll() is None:
                self.stop()
                raise TimeoutError(
                    f"JupyterLab did not answer within {timeout:.0f} s:\n" + self.log_tail()
                )
            if "already in use" not in self.log_tail():
                break
        raise RuntimeError("JupyterLab exited at start-up:\n" + self.log_tail())

    def log_tail(self, lines: int = 30) -> str:
        logs = sorted(self.state.glob("server-*.log"), key=lambda p: p.stat().st_mtime)
        return "\n".join(logs[-1].read_text().splitlines()[-lines:]) if logs else ""

    def api(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
        """One REST call with the token; the decoded JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                text = answer.read()
        except urllib.error.HTTPError as exc:  # the server's own words, and its log
            detail = exc.read().decode(errors="replace")[:2000]
            raise LabError(
                f"{method} {path} answered {exc.code}: {detail}\nserver log:\n{self.log_tail()}"
            ) from None
        return json.loads(text) if text else None

    def url(self, rel: str) -> str:
        """The lab opened on one document, with a fresh workspace (``reset``)."""
        return f"{self.base}/lab/tree/{rel}?reset&token={self.token}"

    def session(self, rel: str) -> dict[str, Any] | None:
        return next((s for s in self.api("GET", "/api/sessions") if s["path"] == rel), None)

    def children(self) -> list[int]:
        """The server's live descendants: kernels and whatever they started."""
        return [p for p in descendants(self.proc.pid) if is_alive(p)] if self.proc else []

    def end_session(self, rel: str, wait: float = 15.0) -> None:
        """Delete the notebook's session, which shuts its kernel down, so the next notebook
        starts with a fresh kernel; wait a little for the kernel's processes to be gone."""
        if (found := self.session(rel)) is not None:
            self.api("DELETE", f"/api/sessions/{found['id']}", timeout=60)
        deadline = time.monotonic() + wait
        while self.children() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        """Shut every kernel and the server down; whatever is still running is killed."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                for kernel in self.api("GET", "/api/kernels"):
                    self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout=60)
                self.api("POST", "/api/shutdown", timeout=30)
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired, LabError):
                pass
        if self.proc.poll() is None or any(is_alive(p) for p in descendants(self.proc.pid)):
            kill_tree(self.proc)
        self.proc.wait()
        self.proc = None


@contextmanager
def running_lab(root: Path, state: Path) -> Iterator[Lab]:
    """A started Lab, stopped with all its kernels on the way out (also after a failure)."""
    lab = Lab(root, state)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()


@contextmanager
def chromium_page(executable: str) -> Iterator[Any]:
    """One headless Chromium page; browser and Playwright's driver end on the way out."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(60_000)  # two shared cores: clicks can be slow
            yield page
        finally:
            browser.close()


def _menu(page: Any, menu: str, command: str) -> None:
    """Click a main-menu entry, as a learner would: the menu, then the item."""
    page.locator(MENU_ITEM, has_text=re.compile(rf"^{menu}$")).click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').click()


def _wait_for_kernel(page: Any, display_name: str, timeout: float) -> None:
    """Wait for the status bar to name the kernel and say Idle (the toolbar's "idle" shows
    before any kernel exists)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = page.locator(KERNEL_ITEM)
        text = item.first.inner_text() if item.count() else ""
        if text.startswith(display_name) and text.endswith("Idle"):
            return
        time.sleep(0.25)
    raise TimeoutError(f"no idle kernel {display_name!r} after {timeout:.0f} s (saw {text!r})")


def _wait_for_run_all(page: Any, timeout: float) -> bool:
    """True once no cell is queued or running and the kernel is idle, twice in a row; the
    run must have been seen to start (a prompt [*] or a number) before it can count as done."""
    deadline = time.monotonic() + timeout
    started, calm = False, 0
    while time.monotonic() < deadline:
        cells = page.evaluate(CELLS_JS, PROGRESS) or []
        prompts = [c["prompt"] for c in cells if c["code"]]
        busy = any(p.startswith("[*]") for p in prompts)
        started = started or busy or any(re.match(r"\[\d+\]", p) for p in prompts)
        status = page.locator(KERNEL_ITEM).first.inner_text()
        if status.endswith("Dead"):
            return False  # the kernel died: nothing more will run
        calm = calm + 1 if started and status.endswith("Idle") and not busy else 0
        if calm >= 2:
            return True
        time.sleep(0.5)
    return False


def _save(page: Any, lab: Lab, rel: str, timeout: float = 30.0) -> nbformat.NotebookNode | None:
    """Save from the File menu and read the notebook back from the server.

    The server writes the file in place (keeping a backup), so a read during the save can see
    half a file: the file's date is polled without its content, the page must show the tab
    clean (the save answered), and only then is the content read.
    """
    path = f"/api/contents/{rel}"
    before = lab.api("GET", f"{path}?content=0")["last_modified"]
    _menu(page, "File", "docmanager:save")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        written = lab.api("GET", f"{path}?content=0")["last_modified"] != before
        if written and not page.locator(DIRTY_TAB).count():
            try:
                return nbformat.from_dict(lab.api("GET", f"{path}?content=1")["content"])
            except LabError:
                pass  # read while still being written: try again
        time.sleep(0.3)
    return None


def _screenshot(page: Any, path: Path) -> None:
    """The whole notebook in one PNG: scrolled to the top, the window grows by what the
    notebook hides below."""
    hidden = page.evaluate(
        "() => { const n = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-WindowedPanel-outer'); if (!n) return 0; n.scrollTop = 0; "
        "return n.scrollHeight - n.clientHeight; }"
    )
    height = min(VIEWPORT["height"] + int(hidden) + 40, 16000)  # Chromium's limit is 16384
    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    time.sleep(0.5)  # let the layout settle at the new size
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)


def run_notebook(
    page: Any,
    lab: Lab,
    rel: str,
    out: Path,
    timeout: float,
    during: Callable[[Any], None] | None = None,
) -> NotebookRun:
    """Open one notebook, clear its outputs, Run All from the menu, wait, move every
    explorer's control, save, look. ``during(page)`` acts while the cells run (Stop, say).

    The notebook's session is deleted afterwards, also when something failed on the way.
    """
    name = Path(rel).stem
    path = lab.root / rel
    nb = nbformat.read(path, as_version=4)
    display = nb.metadata["kernelspec"]["display_name"]
    errors: list[str] = []

    def on_error(exc: Any) -> None:
        errors.append(str(exc))

    page.on("pageerror", on_error)
    start = time.monotonic()
    try:
        page.goto(lab.url(rel))
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        sidebar = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
        if sidebar.count():
            sidebar.first.click()  # fold the file browser away: the notebook gets the width
        _wait_for_kernel(page, display, timeout=120)
        _menu(page, "Edit", "editmenu:clear-all")  # stale prompts would look finished
        page.evaluate(WATCH_WIDGETS_JS, PROGRESS)
        _menu(page, "Run", "runmenu:run-all")
        if during is not None:
            during(page)
        finished = _wait_for_run_all(page, timeout)
        seconds = time.monotonic() - start
        cells = page.evaluate(CELLS_JS, PROGRESS) or []
        ever = page.evaluate("() => window.__widgetsSeen || {}")
        explorers = move_explorers(page)
        for i, cell in enumerate(cells):  # the most each cell showed, then or now
            for key in ("widgets", "progress"):
                cell[f"{key}_end"] = cell[key]
                cell[key] = max(cell[key], ever.get(str(i), {}).get(key, 0))
        session = lab.session(rel)
        model = _save(page, lab, rel)
        out.mkdir(parents=True, exist_ok=True)
        if model is not None:
            nbformat.write(model, out / f"{name}.ipynb")
        shot = out / f"{name}.png"
        _screenshot(page, shot)
    finally:
        page.remove_listener("pageerror", on_error)
        lab.end_session(rel)
    return NotebookRun(
        name=name,
        seconds=seconds,
        finished=finished,
        uses_tqdm=uses_tqdm(nb),
        cells=cells,
        model=model,
        screenshot=shot,
        kernel=session["kernel"]["name"] if session else "",
        page_errors=errors,
        explorers=explorers,
    )


def _explorer_state(box: Any) -> dict[str, str]:
    return box.evaluate(
        "e => ({src: (e.querySelector('img') || {}).src || '', "
        "summary: (e.querySelector('.mgl-summary') || {}).innerText || ''})"
    )


def _nudge(box: Any) -> str:
    """Change the explorer's first control as a learner would; what was moved."""
    handle = box.locator(".noUi-handle").first
    if box.locator(".noUi-handle").count():
        at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
        handle.focus()
        handle.press("ArrowLeft" if at_max else "ArrowRight")
        return "slider"
    toggles = box.locator(".widget-toggle-buttons button:not(.mod-active)")
    if toggles.count():
        toggles.first.click()
        return "toggle buttons"
    box.locator("input[type=checkbox]").first.click()
    return "checkbox"


def move_explorers(page: Any, timeout: float = 180.0) -> list[dict[str, Any]]:
    """Move the first control of every explorer (helpers.explorer) and wait for its redraw.

    One entry per explorer: its cell, what was moved, the summary before and after, and
    whether the figure's image changed. A redraw that never came keeps ``after == before``.
    """
    moved = []
    boxes = page.locator(EXPLORER)
    for k in range(boxes.count()):
        box = boxes.nth(k)
        cell = box.evaluate(
            "e => [...e.closest('.jp-Notebook').querySelectorAll('.jp-Cell')]"
            ".indexOf(e.closest('.jp-Cell'))"
        )
        before = _explorer_state(box)
        control = _nudge(box)
        deadline = time.monotonic() + timeout
        now = before
        while time.monotonic() < deadline:
            now = _explorer_state(box)
            if now["summary"] != before["summary"] and not now["summary"].startswith("…"):
                break
            time.sleep(0.3)
        changed = now["src"] != before["src"]
        moved.append(
            {
                "cell": cell,
                "control": control,
                "before": before["summary"],
                "after": now["summary"],
                "image_changed": changed,
            }
        )
    return moved


def press_stop_when_ranks_report(ranks: int, timeout: float = 120.0) -> Callable[[Any], None]:
    """A ``during`` for run_notebook: once ``ranks`` bars show, click the job's Stop button."""

    def press(page: Any) -> None:
        bars = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .mgl-rank-bar")
        deadline = time.monotonic() + timeout
        while bars.count() < ranks and time.monotonic() < deadline:
            time.sleep(0.3)
        page.locator(LIVE_STOP).first.click()

    return press
