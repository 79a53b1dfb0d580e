"""Every notebook parameter does what its comment says, or the notebook says why not.

Read from the notebooks themselves: the cell tagged ``parameters`` (each name, its default and
its comment, which gives its kind and quick value: ``params.declared``), the cell after it that
opens the lesson (``lesson.start``), and the code that uses them. Then the two cells are run, as
papermill runs them, to see quick mode keep a value the run asked for by name.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from helpers import params
from labtools import runner
from labtools.layers import python_source

STEMS = runner.notebook_stems()
OPENING_LINES = 8  # issue 32: the parameters and the one call, before the lesson's content


@dataclass
class Lesson:
    stem: str
    cell: str  # the parameters cell
    parameters: list[params.Declared]
    setup: str  # the source of the cell that opens the lesson
    code: list[str]  # the other code cells the kernel runs (not %%writefile scripts)

    @property
    def quick(self) -> dict[str, Any]:
        return {p.name: p.quick for p in self.parameters if p.quick is not None}


def read_lesson(stem: str) -> Lesson:
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    [at] = [i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", [])]
    setup = code[at + 1].source  # the next code cell: nothing runs before the check
    kernel = [c for c in code[at + 2 :] if not c.source.lstrip().startswith("%%writefile")]
    others = [python_source(c.source) for c in kernel]
    return Lesson(stem, code[at].source, params.declared(code[at].source), setup, others)


LESSONS = {stem: read_lesson(stem) for stem in STEMS}


@pytest.mark.parametrize("stem", STEMS)
def test_every_parameter_has_a_comment_and_one_call_opens_the_lesson(stem):
    lesson = LESSONS[stem]
    names = [p.name for p in lesson.parameters]
    assert names[:2] == ["out_dir", "quick"], "out_dir and quick come first, in every notebook"
    silent = [p.name for p in lesson.parameters if len(p.comment) < 10]
    assert not silent, f"{stem}: say what {silent} mean(s) in a comment"
    assert f'lesson.start("{stem}", globals()' in lesson.setup, "the cell after the parameters"
    lines = [line for line in (lesson.cell + "\n" + lesson.setup).splitlines() if line.strip()]
    assert len(lines) <= OPENING_LINES, (
        f"{stem}: {len(lines)} lines open the lesson; at most {OPENING_LINES} (issue 32)"
    )


def _is_params_call(node: ast.AST | None, function: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == function
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "params"
    )


def _changes_a_parameter(node: ast.AST, names: set[str]) -> str | None:
    """How ``node`` changes a parameter behind the reader's back, or None."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        hit = [t.id for t in targets if isinstance(t, ast.Name) and t.id in names]
        via = getattr(node, "value", None)
        if hit and not (isinstance(node, ast.Assign) and _is_params_call(via, "adjusted")):
            return f"assigns {hit[0]} (use params.adjusted, which says so)"
    if isinstance(node, ast.IfExp) and "quick" in {
        n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)
    }:
        branches = {b.id for b in (node.body, node.orelse) if isinstance(b, ast.Name)}
        if branches & names:  # "10 if quick else batches": the parameter, or something else
            hit = sorted(branches & names)
            return f"replaces {hit} in quick mode (write '(quick: v)' in its parameters line)"
    return None


@pytest.mark.parametrize("stem", STEMS)
def test_no_cell_changes_a_parameter_without_saying_so(stem):
    lesson = LESSONS[stem]
    names = {p.name for p in lesson.parameters} - {"out_dir"}  # lesson.start resolves it
    found = [
        f"{ast.unparse(node)[:80]!r}: {why}"
        for source in lesson.code
        for node in ast.walk(ast.parse(source))
        if (why := _changes_a_parameter(node, names))
    ]
    assert not found, f"{stem}: " + "; ".join(found)


@pytest.mark.parametrize("stem", STEMS)
def test_every_parameter_is_used(stem):
    """Read by the lesson's code, not only written into the record."""
    lesson = LESSONS[stem]
    read = set()
    for source in lesson.code:
        tree = ast.parse(source)
        read |= {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
    if lesson.quick:
        read.add("quick")  # lesson.start applies quick mode
    read.add("world_size")  # lesson.start caps the plan's ranks with it, and says so
    unused = [p.name for p in lesson.parameters[1:] if p.name not in read]
    assert not unused, f"{stem}: parameters {unused} change nothing the lesson runs"


def run_setup(lesson: Lesson, tmp_path: Path, injected: dict[str, Any]) -> dict[str, Any]:
    """The parameters cell, papermill's injected cell, then the opening cell, in one namespace."""
    ns: dict[str, Any] = {"In": ["", lesson.cell]}
    for p in lesson.parameters:
        ns[p.name] = p.default
    cell = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in injected.items())
    ns["In"].append(cell)
    exec(cell, ns)  # noqa: S102 - the notebook's own cells, as its kernel runs them
    exec(lesson.setup, ns)  # noqa: S102
    return ns


def _another(value: Any) -> Any:
    return not value if isinstance(value, bool) else value + (1 if isinstance(value, int) else 0.5)


@pytest.mark.parametrize("stem", [s for s in STEMS if LESSONS[s].quick])
def test_quick_mode_keeps_a_value_the_run_asked_for(stem, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    lesson = LESSONS[stem]
    base = {"quick": True, "out_dir": str(tmp_path / "plain")}
    ns = run_setup(lesson, tmp_path, base)
    assert {k: ns[k] for k in lesson.quick} == lesson.quick
    defaults = {p.name: p.default for p in lesson.parameters}
    if any(defaults[k] != v for k, v in lesson.quick.items()):
        assert "Quick mode uses " in capsys.readouterr().out
    asked = {k: _another(v) for k, v in lesson.quick.items()}
    ns = run_setup(lesson, tmp_path, {**base, "out_dir": str(tmp_path / "asked"), **asked})
    assert {k: ns[k] for k in asked} == asked
    assert "Quick mode keeps what this run asked for: " in capsys.readouterr().out


@pytest.mark.parametrize("stem", STEMS)
def test_every_adjustment_gives_its_reason_as_a_translatable_template(stem):
    """``why=`` a literal, its numbers passed as values: labtools.i18n's catalog holds it, and
    the Chinese edition prints the reason in Chinese."""
    calls = [
        node
        for source in LESSONS[stem].code
        for node in ast.walk(ast.parse(source))
        if _is_params_call(node, "adjusted")
    ]
    loose = [
        ast.unparse(c)[:80]
        for c in calls
        if not any(k.arg == "why" and isinstance(k.value, ast.Constant) for k in c.keywords)
    ]
    assert not loose, f"{stem}: pass why='...' as a literal template: {loose}"


# A parameter that sizes what a run holds: samples, pixels, tokens, a buffer (issue 47, case 2).
SIZE_LIKE = re.compile(r"(^|_)(batch|batch_size|side|seq_len|tokens|n_train)$|_(kib|mib|gib)$")


@pytest.mark.parametrize("stem", STEMS)
def test_every_size_like_parameter_declares_an_upper_bound(stem):
    """A size far beyond the machine is refused before anything starts (params.upper_bound),
    not met by the kernel's OOM killer a minute later."""
    unbounded = {
        p.name
        for p in LESSONS[stem].parameters
        if SIZE_LIKE.search(p.name) and params.upper_bound(p.comment) is None
    }
    assert not unbounded, (
        f"{stem}: declare the upper bound of {sorted(unbounded)} in its comment, e.g. "
        "'(~1 MiB each)', 'in MiB' or 'at most 20000'"
    )
