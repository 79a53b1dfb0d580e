"""Exercise checks answer with one line and never raise, whatever the student wrote."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_a_prediction_is_compared_with_what_the_job_wrote(capsys):
    """exercise.predicted: the learner's True/False (or list) against a measure of the output."""
    ran = SimpleNamespace(outputs={0: {"max_diff": 3e-7}, 1: {"max_diff": 2e-7}}, returncode=0)
    within = lambda d: d <= 1e-5  # noqa: E731
    exercise.job("99.1", ran, "h", max_diff=exercise.predicted(True, within))
    exercise.job("99.2", ran, "h", max_diff=exercise.predicted(False, within))
    exercise.job("99.3", ran, "h", max_diff=exercise.predicted(..., within))
    assert [exercise.results[n] for n in ("99.1", "99.2", "99.3")] == [True, False, False]
    assert "Replace the `...` with your answer." in capsys.readouterr().out.splitlines()[-1]


def test_a_function_checked_against_a_prediction_asks_for_the_prediction_first(capsys):
    exercise.function("99.4", len, [(("ab",), ...)], hint="h")
    assert exercise.results["99.4"] is False
    assert "Replace the `...` with your answer." in capsys.readouterr().out
    exercise.function("99.5", len, [(("ab",), 2)], hint="h")
    assert exercise.results["99.5"] is True
