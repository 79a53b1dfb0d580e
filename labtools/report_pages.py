"""One run of the notebooks as pages: markdown for a terminal or a CI log, and one HTML file.

The HTML page is self-contained (inline CSS, every figure embedded as a data URI, no script,
no external URL): one file to attach to a nightly job or archive. Its layout is the Jinja
template ``labtools/templates/report.html``; what it says is computed here, translated.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import jinja2

from helpers.messages import _
from labtools.compare import (
    DEFAULT_RULES,
    INFO,
    describe_hardware,
    effective_rule,
    flatten,
    fmt,
    last_line,
    markdown_table,
)
from labtools.run_folder import NotebookRun, ReportError, load_run

KEY_METRICS = 6  # how many metrics the summary table shows per notebook


def key_metrics(metrics: dict[str, Any], limit: int = KEY_METRICS) -> dict[str, Any]:
    """The metrics a rule judges come first: they are the ones a reader compares."""

    def is_judged(name: str, value: Any) -> bool:
        direction = effective_rule(name, DEFAULT_RULES).direction
        return isinstance(value, bool) or direction not in (None, INFO)

    judged = [k for k, v in metrics.items() if is_judged(k, v)]
    rest = [k for k in metrics if k not in judged]
    return {k: metrics[k] for k in (judged + rest)[:limit]}


def _summarize_notebook(nb: NotebookRun) -> dict[str, Any]:
    record = nb.record or {}
    metrics = flatten(record.get("metrics", {}))
    return {
        "notebook": nb.name,
        "status": nb.status,
        "seconds": nb.seconds if nb.seconds is not None else record.get("seconds"),
        "error": nb.error or nb.record_error,
        "hardware": describe_hardware(record.get("hardware")) if record else None,
        "key_metrics": key_metrics(metrics),
        "metrics": metrics,
        "skipped": record.get("skipped", []),
        "figures": [str(p) for p in sorted(nb.folder.glob("*.png"))],
    }


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """One run as plain data: run-level facts and, per notebook, status, metrics and figures."""
    run = load_run(run_dir)
    return {
        "run": str(run.path),
        "started": run.summary.get("started"),
        "quick": run.summary.get("quick"),
        "params": run.summary.get("params", {}),
        "notebooks": [_summarize_notebook(nb) for nb in run.notebooks.values()],
    }


def _status_cell(nb: dict[str, Any]) -> str:
    return f"{nb['status']}: {last_line(nb['error'])}" if nb["error"] else nb["status"]


def _metrics_cell(nb: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={fmt(v)}" for k, v in nb["key_metrics"].items())
    more = len(nb["metrics"]) - len(nb["key_metrics"])
    return shown + (_(" (+{more} more)").format(more=more) if more else "")


def _run_line(summary: dict[str, Any]) -> str:
    return _("Started {started}; quick: {quick}; params: {params}").format(
        started=summary["started"] or _("unknown"),
        quick=summary["quick"],
        params=json.dumps(summary["params"]),
    )


def summary_markdown(summary: dict[str, Any]) -> str:
    """The run as a markdown table, then full errors and skip reasons below it."""
    lines = [_("# Run {run}").format(run=summary["run"]), "", _run_line(summary), ""]
    if not summary["notebooks"]:
        return "\n".join(lines + [_("No notebook folders found.")])
    lines.append(
        markdown_table(
            (
                _("notebook"),
                _("status"),
                _("seconds"),
                _("hardware"),
                _("key metrics"),
                _("skipped"),
            ),
            (
                (
                    nb["notebook"],
                    _status_cell(nb),
                    fmt(nb["seconds"]),
                    nb["hardware"] or "",
                    _metrics_cell(nb),
                    "; ".join(str(s.get("what")) for s in nb["skipped"]),
                )
                for nb in summary["notebooks"]
            ),
        )
    )
    for nb in summary["notebooks"]:
        if nb["error"]:
            lines += ["", f"## {nb['notebook']}: {nb['status']}", "", "```", nb["error"], "```"]
        lines += [
            _("- SKIPPED in {notebook}: {what} -- {why}").format(
                notebook=nb["notebook"], what=s.get("what"), why=s.get("why")
            )
            for s in nb["skipped"]
        ]
    return "\n".join(lines)


# ---------------------------------------------------------------- HTML

TEMPLATES = Path(__file__).resolve().parent / "templates"


def data_uri(path: str) -> str:
    """A PNG as a data URI, so the page is one file with nothing to fetch."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _page_notebook(nb: dict[str, Any]) -> dict[str, Any]:
    """What the template shows of one notebook, as text (the template escapes it)."""
    return {
        "name": nb["notebook"],
        "status": nb["status"],
        "status_line": _status_cell(nb),
        "seconds": fmt(nb["seconds"]),
        "hardware": nb["hardware"] or _("no record"),
        "error": nb["error"],
        "key_metrics": _metrics_cell(nb),
        "skipped_whats": "; ".join(str(s.get("what")) for s in nb["skipped"]),
        "skipped": [(str(s.get("what")), str(s.get("why"))) for s in nb["skipped"]],
        "metrics": [(name, fmt(value)) for name, value in nb["metrics"].items()],
        "figures": [(Path(path).name, data_uri(path)) for path in nb["figures"]],
    }


def summary_html(summary: dict[str, Any]) -> str:
    """A self-contained page: inline CSS, figures as base64, no script, no external URL."""
    pages = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    labels = {
        "notebook": _("notebook"),
        "status": _("status"),
        "seconds": _("seconds"),
        "key_metrics": _("key metrics"),
        "skipped": _("skipped"),
        "SKIPPED": _("SKIPPED"),
        "metric": _("metric"),
        "value": _("value"),
    }
    # TRANSLATORS: the HTML lang attribute of the report page, e.g. zh-CN
    lang = _("en")
    return pages.get_template("report.html").render(
        lang=lang,
        title=_("Run {run}").format(run=summary["run"]),
        run_line=_run_line(summary),
        labels=labels,
        notebooks=[_page_notebook(nb) for nb in summary["notebooks"]],
    )


def write_page(path: Path, text: str) -> None:
    """Write one page, saying where; an unwritable path is a ReportError (exit code 2)."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise ReportError(f"{path}: cannot write ({exc.strerror or exc})") from None
    print(_("Wrote {path}").format(path=path), file=sys.stderr)
