"""Exercise checks: an immediate, friendly verdict after each exercise cell.

A check never raises. In the student copy the solution cells are stubs (``answer = ...``,
functions that raise ``NotImplementedError``), and a traceback there would read as "the
notebook is broken" instead of "your turn": every check turns missing work, exceptions and
wrong answers into one line with a hint, and remembers the verdict for the notebook's record.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from helpers.messages import _

results: dict[str, bool] = {}


def report(exercise: str, ok: bool, hint: str, detail: str = "") -> None:
    """Print the verdict and remember it in ``results``; ``hint`` is shown only when the answer
    is not right. Nothing is returned, so a one-line check cell shows the verdict alone."""
    results[exercise] = ok
    if ok:
        print(
            _("✅ Exercise {exercise}: correct. {detail}")
            .format(exercise=exercise, detail=detail)
            .rstrip()
        )
    else:
        print(
            _("❌ Exercise {exercise}: not yet. {detail} Hint: {hint}")
            .format(exercise=exercise, detail=detail, hint=_(hint))
            .replace("  ", " ")
        )


def missing(value: Any) -> bool:
    """The student copy's stubs: ``...`` (and None) mean "not answered yet"."""
    return value is Ellipsis or value is None


def _close(answer: Any, expected: Any, tol: float) -> bool:
    if isinstance(expected, float) or isinstance(answer, float):
        try:
            return math.isclose(float(answer), float(expected), rel_tol=tol, abs_tol=tol)
        except (TypeError, ValueError):
            return False
    return answer == expected


def equal(exercise: str, answer: Any, expected: Any, hint: str, tol: float = 1e-6) -> None:
    """An answer that is a value: a number (within ``tol``), a string, a dtype, a list ..."""
    if missing(answer):
        return report(exercise, False, hint, _("Replace the `...` with your answer."))
    if _close(answer, expected, tol):
        return report(exercise, True, hint)
    return report(exercise, False, hint, _("Your answer was {answer!r}.").format(answer=answer))


def _call(fn: Callable[..., Any], args: tuple) -> tuple[Any, str | None]:
    """Run student code; an exception becomes a one-line explanation instead of a traceback."""
    try:
        return fn(*args), None
    except NotImplementedError:
        return None, _("The function is still the stub: write its body.")
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return None, _("It raised {error}: {exc} (line {line}).").format(
            error=type(exc).__name__, exc=exc, line=where.lineno
        )


def function(
    exercise: str, fn: Any, cases: Iterable[tuple[tuple, Any]], hint: str, tol: float = 1e-6
) -> None:
    """An answer that is a function: each ``(args, expected)`` case must come out right. An
    expected value may be the learner's prediction: while it is ``...`` the check asks for it."""
    if missing(fn) or not callable(fn):
        return report(exercise, False, hint, _("Define the function asked for."))
    cases = list(cases)
    if any(missing(expected) for _args, expected in cases):
        return report(exercise, False, hint, _("Replace the `...` with your answer."))
    for args, expected in cases:
        got, problem = _call(fn, args)
        if problem:
            detail = _("Called with {args}: {problem}").format(args=args, problem=problem)
            return report(exercise, False, hint, detail)
        if not _close(got, expected, tol):
            detail = _("Called with {args} it returned {got!r}, expected {expected!r}.").format(
                args=args, got=got, expected=expected
            )
            return report(exercise, False, hint, detail)
    return report(exercise, True, hint)


def _matches(got: Any, want: Any, tol: float) -> bool:
    return bool(want(got)) if callable(want) else _close(got, want, tol)


def _job_facts(result: Any) -> tuple[dict[int, Any], Any]:
    """(each rank's output, the result) of a job that ran, or of one that failed (caught)."""
    result = getattr(result, "result", result)  # launch.WorkerFailed keeps its LaunchResult
    return dict(getattr(result, "outputs", {}) or {}), result


def predicted(prediction: Any, measure: Callable[[Any], Any]) -> Any:
    """An expected value for :func:`job` from the learner's prediction of a fact the job's
    output holds but does not state (equal or not, which chunks, a peak in a dict): what
    ``measure`` makes of the value the job wrote must equal ``prediction``. A prediction still
    ``...`` is passed on as it is, so the check asks for it instead of failing."""
    if missing(prediction):
        return prediction
    return lambda got: measure(got) == prediction


def job(exercise: str, result: Any, hint: str, tol: float = 1e-6, **expected: Any) -> None:
    """An answer that is a distributed job: what its ranks wrote must show ``expected``.

    ``result`` is what ``launch.torchrun`` returned, or the ``WorkerFailed`` it raised, caught.
    Each expected name is looked up in every rank's output (``write_rank_output``), then on
    the result itself (``returncode``, ``log``); its value must equal the one given (a number
    within ``tol``), or make the function given return True, on every rank that wrote it.
    """
    if missing(result):
        return report(exercise, False, hint, _("Run the job: replace the `...`."))
    if any(missing(want) for want in expected.values()):
        return report(exercise, False, hint, _("Replace the `...` with your answer."))
    outputs, launched = _job_facts(result)
    for name, want in expected.items():
        seen = {r: out[name] for r, out in sorted(outputs.items()) if name in out}
        if not seen and hasattr(launched, name):
            seen = {None: getattr(launched, name)}
        if not seen:
            detail = _("No rank wrote {name}; the ranks wrote {names}.").format(
                name=name, names=sorted({k for out in outputs.values() for k in out}) or "nothing"
            )
            return report(exercise, False, hint, detail)
        for rank, got in seen.items():
            if not _matches(got, want, tol):
                who = _("the job") if rank is None else _("rank {rank}").format(rank=rank)
                shown = str(got) if len(str(got)) < 80 else str(got)[:77] + "..."
                detail = _("In {who}, {name} was {got}.").format(who=who, name=name, got=shown)
                return report(exercise, False, hint, detail)
    return report(exercise, True, hint)


def summary() -> dict[str, bool]:
    """Each exercise checked so far and whether it passed (goes into metrics.json)."""
    return dict(results)
