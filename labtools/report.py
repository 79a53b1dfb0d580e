"""The command line over a run folder: summarise one run, or compare two and flag regressions.

``make run`` leaves ``runs/<timestamp>/`` (labtools.run_folder). A nightly job wants two things from
it: a page a person can read (labtools.report_pages) and a verdict a script can act on
(labtools.compare). So::

    python -m labtools.report summary RUN_DIR [--html PATH] [--md PATH]
        Markdown table on stdout, also written to RUN_DIR/report.md, and a self-contained
        RUN_DIR/report.html with every figure embedded (one file to attach or archive).
        ``summary`` may be left out: ``python -m labtools.report RUN_DIR``.

    python -m labtools.report compare BASE_RUN NEW_RUN [--config FILE] [--force] [--all]
        Metric by metric, with tolerances that know which way is worse (the rules and the
        config format: ``python -m labtools.report compare -h``).

Exit codes: 0 fine; 1 ``compare`` found a regression; 2 the question cannot be answered
(unreadable run or metrics.json, bad config, different hardware without ``--force``). A run
folder literally named ``compare`` or ``summary`` must be given as ``./compare``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from helpers.messages import _
from labtools import compare, report_pages
from labtools.run_folder import ReportError

COMMANDS = ("summary", "compare")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m labtools.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True)
    summary = commands.add_parser(
        "summary", help="one run: markdown on stdout, report.md and report.html"
    )
    summary.add_argument("run_dir", type=Path, help="runs/<timestamp>/ as left by make run")
    summary.add_argument("--html", type=Path, help="the HTML page (default RUN_DIR/report.html)")
    summary.add_argument("--md", type=Path, help="the markdown (default RUN_DIR/report.md)")
    judge = commands.add_parser(
        "compare",
        help="two runs, metric by metric; exit 1 on a regression",
        description=compare.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    judge.add_argument("base", type=Path, help="the reference run folder")
    judge.add_argument("new", type=Path, help="the run to judge")
    judge.add_argument("--config", type=Path, help="JSON file of tolerance rules (see above)")
    judge.add_argument("--force", action="store_true", help="compare runs on different hardware")
    judge.add_argument("--all", action="store_true", help="show unchanged metrics too")
    return top


def write_pages(run_dir: Path, html: Path | None = None, md: Path | None = None) -> int:
    """Print the run's markdown and write both pages."""
    summary = report_pages.summarize(run_dir)
    markdown = report_pages.summary_markdown(summary)
    print(markdown)
    report_pages.write_page(md or run_dir / "report.md", markdown + "\n")
    report_pages.write_page(html or run_dir / "report.html", report_pages.summary_html(summary))
    return 0


def compare_runs(
    base: Path, new: Path, config: Path | None = None, force: bool = False, show_all: bool = False
) -> int:
    """Print the comparison; 1 when something regressed."""
    comparison = compare.compare(base, new, config=config, force=force)
    print(comparison.to_markdown(all_rows=show_all))
    return 1 if comparison.regressed else 0


def exit_code(answer: Callable[[], int]) -> int:
    """``answer()``, or 2 with the reason when the question cannot be answered."""
    try:
        return answer()
    except ReportError as exc:
        print(_("error: {message}").format(message=exc), file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 fine, 1 regressed, 2 cannot answer)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "summary")  # the short form: python -m labtools.report RUN_DIR
    args = parser().parse_args(argv)
    if args.command == "compare":
        return exit_code(
            lambda: compare_runs(args.base, args.new, args.config, args.force, args.all)
        )
    return exit_code(lambda: write_pages(args.run_dir, args.html, args.md))


if __name__ == "__main__":
    sys.exit(main())
