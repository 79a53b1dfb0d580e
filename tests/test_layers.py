"""Two wings, computed from the imports (labtools.layers): the lesson kit and the tools wing.

A notebook or a taught script imports helpers/ only; ``make`` runs labtools/. No kit module
imports the tools wing, so a lesson runs under plain JupyterLab, papermill or nbconvert without
it, and nothing anywhere imports in a loop.
"""

from __future__ import annotations

from labtools import layers


def test_the_lessons_reach_the_kit_and_nothing_else():
    edges = layers.graph()
    for stem, imports in layers.lesson_imports().items():
        reach = layers.reached(imports, edges)
        tools = sorted(m for m in reach if m.startswith("labtools."))
        assert not tools, f"{stem} reaches the tools wing: {tools} (move them to helpers/)"


def test_no_kit_module_imports_the_tools_wing():
    for module, imports in layers.graph().items():
        if module.startswith("helpers."):
            tools = sorted(m for m in imports if m.startswith("labtools."))
            assert not tools, f"{module} imports {tools}: the kit never needs the tools wing"


def test_every_kit_module_serves_a_lesson():
    """helpers/ holds only what the lessons import, directly or through another kit module."""
    edges = layers.graph()
    reach = layers.reached(set().union(*layers.lesson_imports().values()), edges)
    idle = sorted({f"helpers.{m}" for m in layers.modules("helpers")} - reach)
    assert not idle, f"no lesson reaches {idle}: move them to labtools/ (or remove them)"


def test_no_import_loops():
    assert layers.loops(layers.graph()) == []


def test_the_loop_finder_finds_a_loop():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert layers.loops(edges) == [["a", "b", "c"], ["e"]]
    assert layers.imported("from helpers import env, live\nimport labtools.runner") == {
        "helpers.env",
        "helpers.live",
        "labtools.runner",
    }
    command = 'argv = [sys.executable, "-m", "helpers.torchrun", "-m", "torch.distributed.run"]'
    assert layers.imported(command) == {"helpers.torchrun"}
