"""A learner runs a notebook, saves it, and git still sees the kit unchanged (issue #30, item 2).

`make setup` defines the nbstripout clean filter that .gitattributes names (Makefile, target
git-filter). These tests run that recipe in a clone of this checkout, save a notebook the way
JupyterLab does after Run All (nbformat.write with outputs, execution counts, widget state and a
kernel's language_info) and ask git what it sees.

What the filter alone gives: `git diff` stays empty and every committed notebook passes the filter
unchanged. What it does not: git trusts its index's file size, so a saved notebook whose size
changed is listed as modified by `git status` (the filter never runs), and `git pull` of a change
to it refuses ("local changes would be overwritten"). `make lab`'s post-save hook
(labtools/savehook.py) refreshes that index entry after every save, only when the filtered content
is the committed one, which makes both work.

JupyterLab writes the kernelspec of the kernel it ran (issue 47, case 5): the one the notebook
names when it is installed, else its default, ipykernel's "Python 3 (ipykernel)". nbstripout keeps
the kernelspec, so the committed notebooks name the kernel `make setup` installs for `make lab`,
as JupyterLab writes it.

Not covered: JupyterLab itself (its save is nbformat's writer, used here, with the kernelspec
JupyterLab would write), a learner who edits a cell's source and then pulls a change to the same
lines (a real conflict, as for any file), and a learner who picks another kernel (that changes the
notebook). The pull replaces a
saved notebook that the update changes with the new version, so its outputs go; notebooks the
update does not touch keep theirs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from helpers.paths import REPO_ROOT
from labtools import savehook

pytestmark = pytest.mark.usefixtures("no_orphans")  # git and make start processes: the job lane

NOTEBOOK = "notebooks/00_environment.ipynb"
UNTOUCHED = "notebooks/01_data_parallel.ipynb"


@pytest.fixture
def git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Git without the machine's global or system config (a filter or identity set there)."""
    config = tmp_path / "gitconfig"
    config.write_text("[user]\n\tname = Learner\n\temail = learner@example.invalid\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return dict(os.environ)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def install_filter(repo: Path) -> None:
    """What `make setup` runs: the Makefile's git-filter recipe, with this venv's Python."""
    subprocess.run(
        ["make", "-s", "-C", str(repo), "-f", str(REPO_ROOT / "Makefile"), "git-filter"]
        + [f"VENV={sys.prefix}"],
        check=True,
        timeout=60,
    )


@pytest.fixture
def origin(tmp_path: Path, git_env: dict[str, str]) -> Path:
    """The kit's repository: this checkout's HEAD, with its .gitattributes committed."""
    repo = tmp_path / "origin"
    git(tmp_path, "clone", "--quiet", str(REPO_ROOT), str(repo))
    (repo / ".gitattributes").write_bytes((REPO_ROOT / ".gitattributes").read_bytes())
    git(repo, "add", ".gitattributes")
    if git(repo, "status", "--porcelain"):  # not committed yet in this checkout
        git(repo, "commit", "--quiet", "-m", "nbstripout filter")
    return repo


@pytest.fixture
def learner(tmp_path: Path, origin: Path) -> Path:
    """A learner's checkout after `make setup`."""
    repo = tmp_path / "learner"
    git(tmp_path, "clone", "--quiet", str(origin), str(repo))
    install_filter(repo)
    return repo


def kit_kernel() -> dict[str, str]:
    """The kernelspec of the kernel `make setup` installs for `make lab` (Makefile)."""
    recipe = (REPO_ROOT / "Makefile").read_text()
    found = re.search(
        r'ipykernel install --sys-prefix --name (\S+) --display-name "([^"]+)"', recipe
    )
    assert found, "the Makefile's setup installs the kit's kernel"
    return {"display_name": found[2], "language": "python", "name": found[1]}


def kernelspec_lab_writes(named: str) -> dict[str, str]:
    """The kernelspec JupyterLab saves: of the kernel the notebook names if it is installed (as
    `make setup` installs the kit's), else of its default kernel, ipykernel's python3."""
    if named == kit_kernel()["name"]:
        return kit_kernel()
    try:
        spec = KernelSpecManager().get_kernel_spec(named)
    except NoSuchKernel:
        named, spec = "python3", KernelSpecManager().get_kernel_spec("python3")
    return {"display_name": spec.display_name, "language": spec.language, "name": named}


def save_after_run(path: Path) -> None:
    """What JupyterLab writes after Run All: outputs, counts, widget state, the kernel's info."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"] = kernelspec_lab_writes(nb.metadata["kernelspec"]["name"])
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    for n, cell in enumerate(code, 1):
        cell.execution_count = n
        cell.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text=f"cell {n} ran\n"),
            nbformat.v4.new_output("execute_result", {"text/plain": f"{n}"}, execution_count=n),
        ]
        cell.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00.000000Z"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.2",
    }
    nbformat.write(nb, path)


def has_outputs(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


def test_setup_installs_the_filter(learner: Path):
    config = git(learner, "config", "--local", "--list")
    clean = git(learner, "config", "filter.nbstripout.clean").strip()
    assert clean == f'"{sys.prefix}/bin/python" -m nbstripout --keep-id', config
    assert git(learner, "config", "filter.nbstripout.required").strip() == "true"
    assert "nbstripout" in git(learner, "config", "diff.ipynb.textconv")
    attrs = git(learner, "check-attr", "filter", "diff", "--", NOTEBOOK)
    assert "filter: nbstripout" in attrs and "diff: ipynb" in attrs, attrs


def test_setup_outside_a_checkout_configures_nothing(tmp_path: Path, git_env: dict[str, str]):
    """A tarball or the Docker image has no .git: the recipe passes and writes nothing."""
    copy = tmp_path / "kit"
    copy.mkdir()
    install_filter(copy)
    assert list(copy.iterdir()) == []


def test_every_lesson_names_the_kernel_make_lab_runs():
    """Issue 47, case 5: JupyterLab saved "Python 3 (ipykernel)" over the committed "Python 3"
    and the filter kept it, so a learner's save left the lesson modified."""
    wrong = {
        path.name: spec
        for path in sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        if (spec := nbformat.read(path, as_version=4).metadata.get("kernelspec")) != kit_kernel()
    }
    assert not wrong, f"kernelspec must be {kit_kernel()}: {wrong}"


def test_committed_notebooks_pass_the_filter_unchanged(learner: Path):
    """Otherwise every notebook would show as modified right after `make setup`."""
    git(learner, "add", "--renormalize", ".")
    assert git(learner, "status", "--porcelain") == ""


def save_in_lab(repo: Path, name: str) -> None:
    """JupyterLab's save after Run All, then the post-save hook `make lab` configures."""
    save_after_run(repo / name)
    savehook.refresh_git_index(
        model={"type": "notebook"}, os_path=str(repo / name), contents_manager=None
    )


def update_upstream(origin: Path) -> None:
    """The kit changes the notebook the learner ran."""
    nb = nbformat.read(origin / NOTEBOOK, as_version=4)
    nb.cells[0].source += "\n\nA line added upstream."
    nbformat.write(nb, origin / NOTEBOOK)
    git(origin, "commit", "--quiet", "-am", "lesson update")


def test_saved_run_leaves_status_clean_and_pulls(origin: Path, learner: Path):
    for name in (NOTEBOOK, UNTOUCHED):
        save_in_lab(learner, name)
        assert has_outputs(learner / name)
    assert git(learner, "status", "--porcelain") == ""
    assert git(learner, "diff") == "" and git(learner, "diff", "--cached") == ""

    update_upstream(origin)
    git(learner, "pull", "--quiet", "--no-rebase", "--no-edit")
    pulled = nbformat.read(learner / NOTEBOOK, as_version=4)
    assert pulled.cells[0].source.endswith("A line added upstream.")
    assert has_outputs(learner / UNTOUCHED), "a notebook the pull did not change kept its outputs"
    assert git(learner, "status", "--porcelain") == ""


def test_the_hook_stages_nothing_and_leaves_a_learners_edit_alone(learner: Path):
    nb = nbformat.read(learner / NOTEBOOK, as_version=4)
    nb.cells[0].source += "\n\nMy own note."
    nbformat.write(nb, learner / NOTEBOOK)
    save_in_lab(learner, NOTEBOOK)
    assert git(learner, "status", "--porcelain").split() == ["M", NOTEBOOK]  # shown, not staged
    assert git(learner, "diff", "--cached") == ""
    assert "My own note." in git(learner, "diff")


def test_the_hook_does_nothing_outside_a_checkout(tmp_path: Path, git_env: dict[str, str]):
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), path)
    savehook.refresh_git_index(model={"type": "notebook"}, os_path=str(path))  # no error


def test_make_lab_installs_the_hook():
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO_ROOT), "lab"], capture_output=True, text=True, timeout=60
    )
    assert "--ContentsManager.post_save_hook=labtools.savehook.refresh_git_index" in dry.stdout
