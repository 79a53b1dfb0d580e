"""Compare two runs of the notebooks metric by metric, with tolerances that know which way is worse.

A nightly job wants a verdict a script can act on (labtools.report_pages makes the page a person
reads)::

    python -m labtools.report compare BASE_RUN NEW_RUN [--config FILE] [--force] [--all]

Exit codes: 0 fine; 1 ``compare`` found a regression (a metric beyond tolerance, a metric or
notebook gone, a notebook that passed and now fails, a section newly skipped); 2 the question
cannot be answered (unreadable run or metrics.json, bad config, different hardware without
``--force``). A run folder literally named ``compare`` must be given as ``./compare``.

Which way is worse is read from the metric's name (nested metrics are flattened to dotted
names such as ``samples_per_s.2``). A pattern matches the whole dotted name, any dotted tail,
or any one part of it. Rules are ordered and merged field by field: the first matching rule
that sets a field wins. Defaults (``DEFAULT_RULES``):

    pattern          direction          regression when
    max_*diff*       bound              |new| > 1e-5, whatever the base was
    *synthetic*      info               never (synthetic data is reported, not judged)
    samples_per_s*   higher_is_better   it drops by more than 25% (CPU timings are noisy)
    *speedup*        higher_is_better   it drops by more than 25%
    *efficiency*     higher_is_better   it drops by more than 25%
    *throughput*     higher_is_better   it drops by more than 25%
    *accuracy*       higher_is_better   it drops by more than 0.02 (absolute)
    *bytes*          lower_is_better    it rises by more than 10%
    *memory*         lower_is_better    it rises by more than 10%
    seconds          lower_is_better    it rises by more than 50% (the notebook's wall time)
    *_seconds        lower_is_better    it rises by more than 50% and more than 10 ms

Booleans are judged on their own: true -> false is a regression (``allreduce_ok``), unless a
rule says ``info``. A number that became null (NaN or inf in the notebook) under a directional
rule is a regression. Everything else is ``info``: shown when it changed, never failing.
The allowed slack of a number is ``max(abs_tol, rel_tol * |base|)``.

The config file is JSON (it works on every Python the kit supports; ``tomllib`` would need
3.11). Its rules come before the defaults, and a notebook's own rules before both::

    {"rules": [{"match": "samples_per_s*", "rel_tol": 0.10}],
     "notebooks": {"02_distributed_data_parallel":
                   {"rules": [{"match": "max_param_diff", "bound": 1e-4}]}}}

A rule holds ``match`` and any of ``direction`` (higher_is_better, lower_is_better, bound,
info), ``rel_tol``, ``abs_tol``, ``bound``; unset fields come from the next matching rule, so
to judge accuracy relatively write ``{"match": "*accuracy*", "rel_tol": 0.05, "abs_tol": 0}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from helpers.messages import _
from labtools.run_folder import NotebookRun, ReportError, Run, as_run

HIGHER, LOWER, BOUND, INFO = "higher_is_better", "lower_is_better", "bound", "info"
DIRECTIONS = (HIGHER, LOWER, BOUND, INFO)
OK, IMPROVED, REGRESSED, NEW, MISSING = "ok", "improved", "REGRESSED", "new", "missing"
FAILING = frozenset({REGRESSED, MISSING})
DEFAULT_BOUND = 1e-5


class HardwareMismatch(ReportError):
    """The two runs ran on different hardware, so their numbers say nothing about the code."""


# ---------------------------------------------------------------- rules and configuration


@dataclass(frozen=True)
class Rule:
    """How to judge metrics whose name matches ``match``; ``None`` fields defer to later rules."""

    match: str
    direction: str | None = None
    rel_tol: float | None = None
    abs_tol: float | None = None
    bound: float | None = None


_THROUGHPUT = dict(direction=HIGHER, rel_tol=0.25)
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("max_*diff*", BOUND, bound=DEFAULT_BOUND),
    Rule("*synthetic*", INFO),
    Rule("samples_per_s*", **_THROUGHPUT),
    Rule("*speedup*", **_THROUGHPUT),
    Rule("*efficiency*", **_THROUGHPUT),
    Rule("*throughput*", **_THROUGHPUT),
    Rule("*accuracy*", HIGHER, abs_tol=0.02),
    Rule("*bytes*", LOWER, rel_tol=0.10),
    Rule("*memory*", LOWER, rel_tol=0.10),
    Rule("seconds", LOWER, rel_tol=0.50),
    Rule("*_seconds", LOWER, rel_tol=0.50, abs_tol=0.01),
)
_RULE_FIELDS = ("direction", "rel_tol", "abs_tol", "bound")


def _name_matches(pattern: str, name: str) -> bool:
    """Match the dotted name, any dotted tail or any single part, so nesting does not hide it."""
    parts = name.split(".")
    tails = {".".join(parts[i:]) for i in range(len(parts))}
    return any(fnmatchcase(candidate, pattern) for candidate in tails | set(parts))


def effective_rule(name: str, rules: Sequence[Rule]) -> Rule:
    """Merge every rule matching ``name`` field by field: the first rule to set a field wins.

    Merging (not first-match) lets a config rule state only what it changes, e.g. a tighter
    ``rel_tol`` for ``samples_per_s*`` keeps the default direction.
    """
    merged: dict[str, Any] = dict.fromkeys(_RULE_FIELDS)
    for rule in rules:
        if _name_matches(rule.match, name):
            for key in _RULE_FIELDS:
                if merged[key] is None:
                    merged[key] = getattr(rule, key)
    return Rule(
        match=name,
        direction=merged["direction"],
        rel_tol=merged["rel_tol"] or 0.0,
        abs_tol=merged["abs_tol"] or 0.0,
        bound=DEFAULT_BOUND if merged["bound"] is None else merged["bound"],
    )


@dataclass(frozen=True)
class Config:
    """User rules (global and per notebook) that take precedence over ``DEFAULT_RULES``."""

    rules: tuple[Rule, ...] = ()
    notebooks: dict[str, tuple[Rule, ...]] = field(default_factory=dict)

    def rules_for(self, notebook: str) -> tuple[Rule, ...]:
        return self.notebooks.get(notebook, ()) + self.rules + DEFAULT_RULES


def _parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict) or not isinstance(raw.get("match"), str):
        raise ReportError(f'{where}: each rule needs a "match" pattern, got {raw!r}')
    unknown = set(raw) - {"match", *_RULE_FIELDS}
    if unknown:
        raise ReportError(f"{where}: unknown rule keys {sorted(unknown)} in {raw!r}")
    if raw.get("direction") not in (None, *DIRECTIONS):
        raise ReportError(f"{where}: direction must be one of {list(DIRECTIONS)}, got {raw!r}")
    for key in ("rel_tol", "abs_tol", "bound"):
        value = raw.get(key)
        if value is not None and (not _is_number(value) or value < 0):
            raise ReportError(f"{where}: {key} must be a number >= 0, got {raw!r}")
    return Rule(**raw)


def _parse_rules(raw: Any, where: str) -> tuple[Rule, ...]:
    if not isinstance(raw, list):
        raise ReportError(f'{where}: "rules" must be a list of rules, got {raw!r}')
    return tuple(_parse_rule(item, where) for item in raw)


def parse_config(data: Any, source: str = "config") -> Config:
    """Check a config object's shape, naming ``source`` in every complaint."""
    if not isinstance(data, dict) or set(data) - {"rules", "notebooks"}:
        raise ReportError(f'{source}: expected an object with "rules" and/or "notebooks"')
    notebooks = data.get("notebooks", {})
    if not isinstance(notebooks, dict):
        raise ReportError(f'{source}: "notebooks" must map notebook names to {{"rules": [...]}}')
    per_notebook = {}
    for name, body in notebooks.items():
        if not isinstance(body, dict) or set(body) - {"rules"}:
            raise ReportError(f'{source}: notebooks.{name} must be {{"rules": [...]}}')
        per_notebook[name] = _parse_rules(body.get("rules", []), f"{source} (notebooks.{name})")
    return Config(_parse_rules(data.get("rules", []), source), per_notebook)


def load_config(path: str | Path) -> Config:
    """Read a JSON config file; errors name the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ReportError(f"{path}: cannot read config ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: config is not valid JSON ({exc}); see --help") from None
    return parse_config(data, str(path))


def _as_config(config: Config | dict | str | Path | None) -> Config:
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return parse_config(config)
    return load_config(config)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects become dotted names (``samples_per_s.2``): one name per judged value."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def record_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """The flattened metrics plus the notebook's wall time as ``seconds``."""
    flat = flatten(record["metrics"])
    flat.setdefault("seconds", record.get("seconds"))
    return flat


# ---------------------------------------------------------------- describing things


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def fmt(value: Any) -> str:
    """A value short enough for a table cell: 4 significant digits, big counts in full."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e4:
            return f"{value:.4g}"
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.3g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return str(value)


def describe_machine(hw: dict[str, Any]) -> str:
    """'cpu with 0 GPUs', 'cuda with 8× NVIDIA H100': what must match for numbers to compare."""
    count, names = hw.get("gpu_count") or 0, list(hw.get("gpu_names") or [])
    if count and names and len(set(names)) == 1:
        gpus = f"{count}× {names[0]}"
    elif names:
        gpus = _("{count} GPUs ({names})").format(count=count, names=", ".join(names))
    else:
        gpus = _("{count} GPUs").format(count=count)
    return _("{device} with {gpus}").format(device=hw.get("device", "?"), gpus=gpus)


def describe_hardware(hw: dict[str, Any] | None) -> str:
    """The hardware block in one line, for the report's tables."""
    if not hw:
        return _("unknown")
    line = _("{machine}, {backend} × {nproc} procs").format(
        machine=describe_machine(hw), backend=hw.get("backend", "?"), nproc=hw.get("nproc", "?")
    )
    if hw.get("driver"):
        line += _(", driver {driver}").format(driver=hw["driver"])
    return _("{line}, {cpus} CPUs, torch {torch}, Python {python}").format(
        line=line,
        cpus=hw.get("cpu_count", "?"),
        torch=hw.get("torch", "?"),
        python=hw.get("python", "?"),
    )


def _fingerprint(hw: dict[str, Any]) -> tuple[Any, ...]:
    return hw.get("device"), hw.get("gpu_count"), tuple(hw.get("gpu_names") or ())


def last_line(text: str | None, width: int = 100) -> str:
    """Tracebacks end with the exception, the most telling line for a table cell."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _cell(text: Any) -> str:
    """Markdown table cells cannot hold pipes or newlines."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------- judging one value


def _judge_bool(base: Any, new: Any) -> str:
    if base is True and new is not True:
        return REGRESSED
    if new is True and base is not True:
        return IMPROVED
    return OK if base == new else INFO


def _judge_bound(rule: Rule, new: Any) -> str:
    if new is None:  # the difference was NaN or inf
        return REGRESSED
    if not _is_number(new):
        return INFO
    return REGRESSED if abs(new) > rule.bound else OK


def judge(rule: Rule, base: Any, new: Any) -> str:
    """ok / improved / REGRESSED / info for one metric present in both runs."""
    if rule.direction == INFO:
        return INFO
    if isinstance(base, bool) or isinstance(new, bool):
        return _judge_bool(base, new)
    if rule.direction == BOUND:
        return _judge_bound(rule, new)
    if rule.direction is None or not _is_number(base):
        return INFO
    if not _is_number(new):
        return REGRESSED if new is None else INFO
    slack = max(rule.abs_tol or 0.0, (rule.rel_tol or 0.0) * abs(base))
    gain = new - base if rule.direction == HIGHER else base - new
    if gain < -slack:
        return REGRESSED
    return IMPROVED if gain > slack else OK


def describe_rule(rule: Rule, base: Any = None, new: Any = None) -> str:
    """What would count as a regression, in words, for the table's 'fails if' column."""
    if rule.direction == INFO:
        return ""
    if isinstance(base, bool) or isinstance(new, bool):
        return "true → false"
    if rule.direction == BOUND:
        return f"|new| > {rule.bound:g}"
    if rule.direction is None:
        return ""
    word = _("drop") if rule.direction == HIGHER else _("rise")
    limits = [f"{rule.rel_tol * 100:g}%"] if rule.rel_tol else []
    limits += [f"{rule.abs_tol:g}"] if rule.abs_tol else []
    if not limits:
        return _("any {change}").format(change=word)
    return f"{word} > {limits[0] if len(limits) == 1 else 'max(' + ', '.join(limits) + ')'}"


def _change(base: Any, new: Any) -> float | None:
    if _is_number(base) and _is_number(new) and base != 0:
        return (new - base) / abs(base)
    return None


# ---------------------------------------------------------------- comparing two runs


@dataclass
class Row:
    """One line of a comparison; ``metric`` is ``(notebook)``/``(status)`` for whole notebooks."""

    notebook: str
    metric: str
    base: Any
    new: Any
    verdict: str
    change: float | None = None  # relative, as a fraction of |base|
    fails_if: str = ""
    note: str = ""

    @property
    def changed(self) -> bool:
        return self.verdict != OK and not (self.verdict == INFO and self.base == self.new)


@dataclass
class Comparison:
    """Every row of a comparison, plus notes (forced hardware, differing parameters)."""

    base: Path
    new: Path
    hardware: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return any(row.verdict in FAILING for row in self.rows)

    def counts(self) -> dict[str, int]:
        verdicts = (REGRESSED, MISSING, IMPROVED, OK, INFO, NEW)
        return {v: sum(row.verdict == v for row in self.rows) for v in verdicts}

    def to_markdown(self, all_rows: bool = False) -> str:
        """The table of changes (every row with ``all_rows``), notes, details and a verdict."""
        lines = [
            _("## Compare {base} → {new}").format(base=self.base, new=self.new),
            "",
            _("Hardware: {hardware}").format(hardware=self.hardware),
            "",
        ]
        lines += [_("- NOTE: {note}").format(note=note) for note in self.notes]
        lines += [""] if self.notes else []
        shown = [row for row in self.rows if all_rows or row.changed]
        if shown:
            lines += [
                markdown_table(
                    (
                        _("notebook"),
                        _("metric"),
                        _("base"),
                        _("new"),
                        _("change"),
                        _("verdict"),
                        _("fails if"),
                    ),
                    (_row_cells(row) for row in shown),
                ),
                "",
            ]
        else:
            lines += [_("No changes beyond tolerance."), ""]
        details = [f"- {row.notebook} {row.metric}: {row.note}" for row in shown if row.note]
        lines += details + ([""] if details else [])
        counts = ", ".join(f"{n} {v}" for v, n in self.counts().items())
        hidden = "" if all_rows else _(" (unchanged metrics hidden; --all shows them)")
        verdict = "REGRESSED" if self.regressed else "OK"
        return "\n".join(lines + [f"**{verdict}**: {counts}{hidden}"])


def _row_cells(row: Row) -> list[str]:
    change = "" if row.change is None else f"{row.change * 100:+.1f}%"
    base = "—" if row.verdict == NEW else fmt(row.base)
    new = "—" if row.verdict == MISSING else fmt(row.new)
    return [row.notebook, row.metric, base, new, change, row.verdict, row.fails_if]


def _metric_row(
    notebook: str, name: str, base: dict[str, Any], new: dict[str, Any], rules: Sequence[Rule]
) -> Row:
    rule = effective_rule(name, rules)
    if name not in new:
        return Row(
            notebook, name, base[name], None, MISSING, note=_("metric gone from the new run")
        )
    if name not in base:
        return Row(notebook, name, None, new[name], NEW)
    b, n = base[name], new[name]
    verdict = judge(rule, b, n)
    note = _("became null (NaN or inf)") if n is None and verdict == REGRESSED else ""
    return Row(notebook, name, b, n, verdict, _change(b, n), describe_rule(rule, b, n), note)


def _skip_rows(notebook: str, base: list[Any], new: list[Any]) -> list[Row]:
    """A section that ran in base and is skipped now, on the same hardware, is a regression."""

    def whats(skips: list[Any]) -> dict[str, str]:
        return {str(s.get("what")): str(s.get("why")) for s in skips if isinstance(s, dict)}

    before, after = whats(base), whats(new)
    rows = [
        Row(notebook, f"skipped: {what}", "ran", "skipped", REGRESSED, note=why)
        for what, why in after.items()
        if what not in before
    ]
    return rows + [
        Row(notebook, f"skipped: {what}", "skipped", "ran", IMPROVED)
        for what in before
        if what not in after
    ]


def _status_row(name: str, base: NotebookRun, new: NotebookRun) -> Row:
    if base.passed:
        verdict = REGRESSED
    else:
        verdict = IMPROVED if new.passed else INFO
    return Row(name, "(status)", base.status, new.status, verdict, note=last_line(new.error, 200))


def _compare_notebook(
    name: str, base: NotebookRun | None, new: NotebookRun | None, rules: Sequence[Rule]
) -> list[Row]:
    if base is None:
        return [Row(name, "(notebook)", None, new.status if new else None, NEW)]
    if new is None:
        verdict = MISSING if base.passed else INFO
        return [Row(name, "(notebook)", base.status, None, verdict, note=_("not in the new run"))]
    if not (base.passed and new.passed):
        return [_status_row(name, base, new)]
    b, n = record_metrics(base.record), record_metrics(new.record)
    rows = [_metric_row(name, m, b, n, rules) for m in {**b, **n}]
    return rows + _skip_rows(name, base.record.get("skipped", []), new.record.get("skipped", []))


def _check_readable(run: Run) -> None:
    """A notebook that passed but left no readable record means the run folder is broken."""
    for nb in run.notebooks.values():
        if nb.passed and nb.record_error:
            raise ReportError(f"{nb.record_error} [{nb.name} is recorded as passed in {run.path}]")


def _hardware_notes(base: Run, new: Run, force: bool) -> list[str]:
    b, n = base.hardware(), new.hardware()
    if not b or not n or _fingerprint(b) == _fingerprint(n):
        return []
    message = _("base ran on {base}, new on {new}: comparing them is meaningless").format(
        base=describe_machine(b), new=describe_machine(n)
    )
    if not force:
        raise HardwareMismatch(
            _("{message}; pass --force to compare anyway").format(message=message)
        )
    return [_("{message}; compared anyway because of --force").format(message=message)]


def _dict_diff(base: dict[str, Any], new: dict[str, Any], ignore: Iterable[str]) -> str:
    keys = [k for k in {**base, **new} if k not in set(ignore) and base.get(k) != new.get(k)]
    return ", ".join(f"{k}: {fmt(base.get(k))} → {fmt(new.get(k))}" for k in keys)


def _param_notes(base: Run, new: Run) -> list[str]:
    """Different parameters (quick vs full) make differences expected, so say so up front."""
    notes = []
    if base.summary.get("quick") != new.summary.get("quick"):
        notes.append(
            _("quick differs: base {base}, new {new}; timings are not comparable").format(
                base=base.summary.get("quick"), new=new.summary.get("quick")
            )
        )
    for name, b in base.notebooks.items():
        n = new.notebooks.get(name)
        if b.record and n and n.record:
            diff = _dict_diff(b.record.get("params", {}), n.record.get("params", {}), ["out_dir"])
            if diff:
                notes.append(_("{name}: parameters differ ({diff})").format(name=name, diff=diff))
    return notes


def compare(
    base: Run | str | Path,
    new: Run | str | Path,
    config: Config | dict | str | Path | None = None,
    force: bool = False,
) -> Comparison:
    """Compare two runs metric by metric; raises ReportError when they cannot be compared."""
    base_run, new_run, cfg = as_run(base), as_run(new), _as_config(config)
    _check_readable(base_run)
    _check_readable(new_run)
    notes = _hardware_notes(base_run, new_run, force) + _param_notes(base_run, new_run)
    rows = []
    for name in {**base_run.notebooks, **new_run.notebooks}:
        rows += _compare_notebook(
            name, base_run.notebooks.get(name), new_run.notebooks.get(name), cfg.rules_for(name)
        )
    hardware = describe_hardware(base_run.hardware() or new_run.hardware())
    return Comparison(base_run.path, new_run.path, hardware, rows, notes)
