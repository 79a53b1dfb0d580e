"""Execute the notebooks headlessly with papermill: what ``make run`` and the test harness share.

Each notebook runs in its own papermill process so a whole-notebook time limit can end it and
everything it started (kernel, torchrun workers) without touching the other notebooks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.messages import _
from helpers.paths import NOTEBOOKS, REPO_ROOT
from helpers.procs import RUN_MARKER, kill_tree, with_environ
from labtools import ledger, run_folder
from labtools.catalog import catalog, catalog_entry  # noqa: F401  (the runner's catalog)
from labtools.i18n import edition_path, editions

KERNEL = "multigpu-lab"  # installed into the venv by `make`; falls back to python3


@dataclass
class Outcome:
    notebook: str
    status: str  # "ok" or "failed"
    seconds: float
    output: str  # the executed notebook
    out_dir: str  # where its metrics.json and figures are
    error: str | None = None
    launches: int = 0  # torchrun jobs the notebook started (labtools.ledger)
    launch_seconds: float = 0.0  # their wall time together


def notebook_stems() -> list[str]:
    """Every notebook in notebooks/, in lesson order (the file name's number)."""
    return sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return KERNEL if KERNEL in KernelSpecManager().find_kernel_specs() else "python3"


def parse_params(text: str) -> list[str]:
    """``-p name value`` pairs as papermill takes them, checked so a typo fails early."""
    words = shlex.split(text or "")
    if len(words) % 3 or any(w not in ("-p", "--parameters") for w in words[::3]):
        raise ValueError(f"PARAMS must be '-p NAME VALUE' pairs, got {text!r}")
    return words


def execute(
    stem: str,
    out_dir: Path,
    *,
    quick: bool,
    params: list[str] = (),
    timeout: float | None = None,
    source: Path | None = None,
    lang: str | None = None,
) -> Outcome:
    """Run one notebook with papermill; never raises for a failing notebook, reports it.

    ``source`` runs another copy of the lesson (the student copy) from its own folder;
    ``lang`` (``zh_CN``) runs the translated edition, built first, from notebooks/<lang>/.
    """
    if lang and source is None:
        source = edition_path(lang, stem)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    entry = catalog_entry(stem)
    timeout = timeout or entry["timeout_quick_s" if quick else "timeout_full_s"]
    output = out_dir / f"{stem}.ipynb"
    source = Path(source or NOTEBOOKS / f"{stem}.ipynb").resolve()
    argv = [
        sys.executable,
        "-m",
        "papermill",
        str(source),
        str(output),
        "--cwd",
        str(source.parent),
        "-k",
        kernel_name(),
        "--no-progress-bar",
        "-p",
        "out_dir",
        str(out_dir),
        "-p",
        "quick",
        str(quick),
        *params,
    ]
    start = time.perf_counter()
    returncode, log = run_marked(argv, out_dir, timeout)
    error = None
    if returncode is None:
        error = timed_out(timeout)
    elif returncode != 0:
        error = failure_report(output, log)
    return finished(stem, start, output, out_dir, error)


def timed_out(timeout: float) -> str:
    return _(
        "timed out after {timeout:.0f} s (catalog.json budget); kernel and workers ended"
    ).format(timeout=timeout)


def finished(stem: str, start: float, output: Path, out_dir: Path, error: str | None) -> Outcome:
    """The Outcome of a client's run that began at ``start`` (``time.perf_counter()``)."""
    seconds = round(time.perf_counter() - start, 2)
    status = "ok" if error is None else "failed"
    jobs = ledger.totals(ledger.read(out_dir))  # how many torchrun jobs, and their seconds
    return Outcome(stem, status, seconds, str(output), str(out_dir), error, *jobs)


def run_marked(
    argv: list[str], out_dir: Path, timeout: float, cwd: Path | None = None
) -> tuple[int | None, str]:
    """Run one notebook client (papermill here; nbconvert and nbval in the tests) in a process
    group of its own, every process it starts marked with ``out_dir`` so that leftovers can be
    found, and end the whole group at ``timeout``. Its exit code (None: timed out) and output.
    Each torchrun job it starts leaves its record in its own folder under ``out_dir``
    (labtools.ledger reads them); records of an earlier run there are removed first."""
    ledger.clear(out_dir)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, RUN_MARKER: str(out_dir)},  # inherited by the kernel and its workers
    )
    try:
        log = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return None, ""
    return proc.returncode, log


def leftover_processes(out_dir: str | Path) -> list[int]:
    """Live processes still carrying this run's marker: workers a notebook left behind."""
    return with_environ(RUN_MARKER, str(Path(out_dir).resolve()))


def failure_report(output: Path, log: str) -> str:
    """Why papermill failed, in a few lines: the first cell with an error output, else the log.

    The verdict is papermill's own exit code, as a scheduler calling papermill directly (cron,
    Airflow, a teacher's CI) would see it: a lesson that shows a failure catches it and prints
    it, so no cell of a passing notebook holds an error output.
    """
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    report = "\n".join(lines[-12:])
    try:
        nb = nbformat.read(output, as_version=4)
    except Exception:
        return report
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                raised = _("cell {i} raised {name}: {value}")
                return raised.format(i=i, name=out.ename, value=out.evalue) + "\n" + report
    return report


def key_metrics(out_dir: str, stem: str) -> str:
    path = Path(out_dir) / "metrics.json"
    if not path.exists():
        return ""
    metrics = json.loads(path.read_text())["metrics"]
    shown = []
    for name in catalog_entry(stem).get("key_metrics", []):
        value = metrics.get(name)
        if isinstance(value, float):
            value = f"{value:.4g}"
        shown.append(f"{name}={value}")
    return ", ".join(shown)


def skips(out_dir: str) -> int:
    path = Path(out_dir) / "metrics.json"
    return len(json.loads(path.read_text())["skipped"]) if path.exists() else 0


def summary_table(outcomes: list[Outcome]) -> str:
    rows = [("notebook", "status", "seconds", "skips", "torchrun jobs", "key metrics")]
    for o in outcomes:
        rows.append(
            (
                o.notebook,
                o.status,
                f"{o.seconds:.1f}",
                str(skips(o.out_dir)),
                f"{o.launches} in {o.launch_seconds:.0f} s" if o.launches else "-",
                key_metrics(o.out_dir, o.notebook),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows
    ]
    for o in outcomes:
        if o.error:
            lines.append(
                _("\n{notebook} failed:\n{error}").format(notebook=o.notebook, error=o.error)
            )
    return "\n".join(lines)


def run_all(
    stems: list[str], run_dir: Path, quick: bool, params: list[str], lang: str | None = None
) -> list[Outcome]:
    outcomes = []
    for stem in stems:
        mode = _("quick") if quick else _("full")
        print(_("-> {stem} ({mode}) ...").format(stem=stem, mode=mode), flush=True)
        outcome = execute(stem, run_dir / stem, quick=quick, params=params, lang=lang)
        done = _("   {status} in {seconds:.1f} s")
        print(done.format(status=outcome.status, seconds=outcome.seconds), flush=True)
        outcomes.append(outcome)
    run_folder.write_summary(run_dir, outcomes, quick, params, lang)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labtools.runner", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smallest settings (what CI uses)")
    parser.add_argument("--params", default="", help="papermill parameters: '-p epochs 3'")
    parser.add_argument("--notebooks", nargs="*", help="stems or number prefixes, e.g. 00 02")
    parser.add_argument("--runs", default=str(REPO_ROOT / "runs"), help="where runs are kept")
    parser.add_argument("--baseline", help="a previous run directory to compare against")
    parser.add_argument(
        "--lang",
        choices=["en", *editions()],
        default="en",
        help="the edition to run: a translation such as zh_CN, or en",
    )
    args = parser.parse_args(argv)
    params = parse_params(args.params)
    stems = notebook_stems()
    if args.notebooks:
        stems = [s for s in stems if any(s.startswith(n) for n in args.notebooks)]
        if not stems:
            parser.error(
                _("no notebook matches {wanted}; have {stems}").format(
                    wanted=args.notebooks, stems=notebook_stems()
                )
            )
    baseline = Path(args.baseline).resolve() if args.baseline else None  # before runs/latest moves
    if baseline and not baseline.is_dir():
        parser.error(
            _("baseline {baseline} is not a run folder (expected runs/<timestamp>)").format(
                baseline=args.baseline
            )
        )
    run_dir = run_folder.new_run_dir(Path(args.runs))
    print(_("Run folder: {run_dir}").format(run_dir=run_dir))
    outcomes = run_all(stems, run_dir, args.quick, params, None if args.lang == "en" else args.lang)
    print("\n" + summary_table(outcomes))
    code = 0 if all(o.status == "ok" for o in outcomes) else 1
    if baseline:
        code = max(code, compare_with(baseline, run_dir))
    return code


def compare_with(baseline: Path, run_dir: Path) -> int:
    """The new run judged against ``baseline``: 0 fine, 1 regressed, 2 cannot compare."""
    from labtools import report  # the tolerance rules and pages: only when asked for a baseline

    return report.exit_code(lambda: report.compare_runs(baseline, run_dir))


if __name__ == "__main__":
    sys.exit(main())
