"""Two layers in helpers/: what the lessons import, and the tooling that runs and reports them.

A notebook or a taught script imports the lesson API; ``make`` runs the tooling (the runner,
the run folder and its reports, the catalog, translations, the student copy, the GPU check).
The lesson API never imports the tooling, so a lesson's behaviour never depends on it.
"""

from __future__ import annotations

import ast

from helpers.paths import REPO_ROOT

HELPERS = REPO_ROOT / "helpers"
LESSON_API = {
    "check",
    "data",
    "devices",
    "env",
    "explorer",
    "frontend",
    "launch",
    "ledger",
    "live",
    "loaders",
    "messages",
    "models",
    "netns",
    "params",
    "paths",
    "procs",
    "progress",
    "record",
    "train",
}
TOOLING = {
    "catalog",
    "compare",
    "gpucheck",
    "i18n",
    "render",
    "report",
    "runner",
    "runs",
    "savehook",
    "scripts",
    "student",
    "troubleshoot",
    "worksheets",
}


def helpers_imported(module: str) -> set[str]:
    """The helpers modules ``module`` imports, at its top or inside a function."""
    tree = ast.parse((HELPERS / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "helpers":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("helpers.")}
    return found


def test_every_module_has_its_layer():
    modules = {p.stem for p in HELPERS.glob("*.py")} - {"__init__"}
    assert modules == LESSON_API | TOOLING, "place a new module in LESSON_API or TOOLING"
    assert not LESSON_API & TOOLING


def test_the_lesson_api_never_imports_the_tooling():
    for module in sorted(LESSON_API):
        assert not helpers_imported(module) & TOOLING, module
