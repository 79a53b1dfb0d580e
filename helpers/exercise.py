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


def report(exercise: str, ok: bool, hint: str, detail: str = "") -> bool:
    """Print the verdict and remember it; ``hint`` is shown only when the answer is not right."""
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
    return ok


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


def equal(exercise: str, answer: Any, expected: Any, hint: str, tol: float = 1e-6) -> bool:
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
) -> bool:
    """An answer that is a function: each ``(args, expected)`` case must come out right."""
    if missing(fn) or not callable(fn):
        return report(exercise, False, hint, _("Define the function asked for."))
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


def reshuffles(exercise: str, epoch_order: Any, hint: str) -> bool:
    """``epoch_order(sampler, epoch)`` must give a new, still disjoint, order every epoch."""
    from torch.utils.data.distributed import DistributedSampler

    if missing(epoch_order) or not callable(epoch_order):
        return report(exercise, False, hint, _("Define epoch_order(sampler, epoch)."))
    samplers = [DistributedSampler(range(64), num_replicas=2, rank=r, seed=0) for r in (0, 1)]
    orders = {}
    for epoch in (0, 1):
        for rank, sampler in enumerate(samplers):
            got, problem = _call(epoch_order, (sampler, epoch))
            if problem:
                return report(exercise, False, hint, problem)
            orders[rank, epoch] = list(got)
    if orders[0, 0] == orders[0, 1]:
        return report(exercise, False, hint, _("Epochs 0 and 1 came out in the same order."))
    if set(orders[0, 1]) & set(orders[1, 1]):
        return report(exercise, False, hint, _("The two ranks' shards overlap."))
    return report(exercise, True, hint, _("New order each epoch, disjoint shards."))


def summary() -> dict[str, bool]:
    """Each exercise checked so far and whether it passed (goes into metrics.json)."""
    return dict(results)
