"""Exercise checks answer with one line and never raise, whatever the student wrote."""

from __future__ import annotations

import pytest

from helpers import exercise


@pytest.fixture(autouse=True)
def fresh_results():
    exercise.results.clear()


def test_equal_verdicts(capsys):
    exercise.equal("t.1", 36, 36, hint="h")
    assert exercise.results["t.1"]
    exercise.equal("t.2", ..., 36, hint="add them up")
    assert not exercise.results["t.2"]
    exercise.equal("t.3", 35, 36, hint="h")
    assert not exercise.results["t.3"]
    exercise.equal("t.4", 0.1 + 0.2, 0.3, hint="h")
    assert exercise.results["t.4"]
    out = capsys.readouterr().out
    assert "✅ Exercise t.1: correct." in out
    assert "❌ Exercise t.2: not yet. Replace the `...` with your answer. Hint: add them up" in out
    assert "Your answer was 35" in out
    assert exercise.summary() == {"t.1": True, "t.2": False, "t.3": False, "t.4": True}


def test_function_turns_exceptions_into_hints(capsys):
    def stub(x):
        raise NotImplementedError

    def broken(x):
        return x / 0

    exercise.function("f.1", stub, [((1,), 2)], hint="double it")
    assert not exercise.results["f.1"]
    exercise.function("f.2", broken, [((1,), 2)], hint="double it")
    assert not exercise.results["f.2"]
    exercise.function("f.3", lambda x: x, [((1,), 2)], hint="double it")
    assert not exercise.results["f.3"]
    exercise.function("f.4", ..., [((1,), 2)], hint="double it")
    assert not exercise.results["f.4"]
    exercise.function("f.5", lambda x: 2 * x, [((1,), 2), ((2.5,), 5.0)], hint="double it")
    assert exercise.results["f.5"]
    out = capsys.readouterr().out
    assert "still the stub" in out and "ZeroDivisionError" in out
    assert "returned 1, expected 2" in out and "Traceback" not in out
