"""The lessons' exercises check the learner's prediction: a unit-lane harness for their tests.

An exercise is a prompt (``**Exercise NN.k: title.**``) at the end of the section that teaches
its idea, a ``solution`` cell that states predictions (``predicted_<what> = ...``) before it
launches the job, and a check cell that compares them with what the job did
(``exercise.job``). ``assert_checked`` runs that check cell against a stand-in job whose ranks
wrote what the lesson's real job writes, without starting anything, and asserts that it passes
with the solution's predictions, fails on a wrong one, and asks for the answer while one is
still the learner copy's ``...``.
"""

from __future__ import annotations

import ast
import contextlib
import io
from types import SimpleNamespace
from typing import Any

import nbformat

from helpers import exercise
from helpers.paths import NOTEBOOKS
from labtools import student


def _cells(stem: str, number: str) -> tuple[list, int, int, int]:
    """The lesson's cells and the indices of the exercise's prompt, solution and check."""
    cells = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4).cells
    check = next(
        i
        for i, c in enumerate(cells)
        if c.cell_type == "code" and "exercise.job(" in c.source and f'"{number}"' in c.source
    )
    solution = max(i for i in range(check) if "solution" in cells[i].metadata.get("tags", []))
    prompt = max(i for i in range(solution) if cells[i].cell_type == "markdown")
    return cells, prompt, solution, check


def solution_predictions(stem: str, number: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """The ``predicted_*`` values the solution assigns, each before the job is launched."""
    cells, _, solution, _ = _cells(stem, number)
    tree = ast.parse(cells[solution].source)
    launch = min(
        (
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and "torchrun" in ast.unparse(n.func)
        ),
        default=None,
    )
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", "")
            if name.startswith("predicted_"):
                assert launch is None or node.lineno < launch, f"{name} is set after the launch"
                expr = compile(ast.Expression(node.value), f"<{number} solution>", "eval")
                found[name] = eval(expr, dict(namespace))  # noqa: S307 (the lesson's own code)
    return found


def _definitions(source: str, wanted: set[str]) -> str:
    """Only the ``wanted`` functions a cell defines (the rest may need a kernel's state)."""
    tree = ast.parse(source)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    return "from __future__ import annotations\n\n" + "\n\n".join(map(ast.unparse, defs))


def verdict(
    stem: str, number: str, outputs: dict[int, dict], namespace: dict[str, Any], **predicted: Any
) -> tuple[bool, str]:
    """Run the exercise's check cell on a stand-in job: (its verdict, what it printed)."""
    cells, prompt, solution, check = _cells(stem, number)
    tree = ast.parse(cells[check].source)
    call = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "exercise.job"
    )
    wanted = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    job = SimpleNamespace(outputs=outputs, returncode=0, log="")
    scope = {"exercise": exercise, **namespace, **predicted, ast.unparse(call.args[1]): job}
    earlier = [
        c.source
        for i, c in enumerate(cells[:check])
        if c.cell_type == "code" and i != solution and not c.source.startswith("%%")
    ]
    for source in earlier:  # the helpers the check calls (like_gpipe, ...)
        exec(_definitions(source, wanted), scope)  # noqa: S102 (the lesson's own code)
    exercise.results.pop(number, None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cells[check].source, scope)  # noqa: S102
    return exercise.results[number], printed.getvalue()


def assert_checked(
    stem: str,
    number: str,
    section: str,
    outputs: dict[int, dict],
    wrong: dict[str, Any],
    namespace: dict[str, Any] | None = None,
) -> None:
    """The exercise sits at the end of ``section``'s text, before the Summary; the check passes
    with the solution's predictions, fails with each wrong one, asks while one is ``...``."""
    namespace = namespace or {}
    cells, prompt, solution, check = _cells(stem, number)
    assert cells[prompt].source.startswith(f"**Exercise {number}: "), cells[prompt].source[:60]
    markdown = [c.source for c in cells[:prompt] if c.cell_type == "markdown"]
    heading = [line for m in markdown for line in m.splitlines() if line.startswith("## ")][-1]
    assert heading.startswith(section), f"{number} sits in {heading!r}"
    predicted = solution_predictions(stem, number, namespace)
    assert predicted and set(wrong) <= set(predicted), (predicted, wrong)
    stub = student.stub(cells[solution].source)
    assert all(f"{name} = ..." in stub for name in predicted), stub
    ok, printed = verdict(stem, number, outputs, namespace, **predicted)
    assert ok, printed
    for name, value in wrong.items():
        ok, printed = verdict(stem, number, outputs, namespace, **{**predicted, name: value})
        assert not ok, f"{number} accepted {name} = {value!r}: {printed}"
    for name in predicted:
        ok, printed = verdict(stem, number, outputs, namespace, **{**predicted, name: ...})
        assert not ok and "Replace the `...`" in printed, printed
