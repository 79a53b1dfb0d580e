"""Live torchrun jobs: the progress line, the bars per rank, the printed summary, Stop.

Every job here runs under the real launcher and checks that nothing is left running; the live
view is the real ipywidgets one (widgets work without a front end, they are just not drawn).
"""

from __future__ import annotations

import math
import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers import env, frontend, launch, live
from helpers.progress import parse_progress, progress_line

STEPS = 5
SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time
    from helpers.progress import progress_line

    rank = int(os.environ["RANK"])
    print(f"rank {{rank}} says hello", flush=True)
    for step in range(1, {STEPS} + 1):
        print(progress_line(step, {STEPS}, 1.0 / step, 100.0 * (rank + 1)), flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def test_progress_line_round_trips_and_refuses_nonsense():
    line = progress_line(25, 62, 0.31214, 812.34)
    assert line == "progress: step 25/62, loss 0.3121, 812.3 samples/s"
    found = parse_progress(line)
    assert (found.step, found.total, found.loss, found.samples_per_s) == (25, 62, 0.3121, 812.3)
    assert found.describe() == "25/62 steps · 812 samples/s · loss 0.3121"
    warming_up = parse_progress(progress_line(1, 62, 2.3, math.nan))
    assert math.isnan(warming_up.samples_per_s) and "… samples/s" in warming_up.describe()
    assert parse_progress("epoch 0 step 25: loss 0.3121") is None
    with pytest.raises(ValueError, match="0 <= step <= total"):
        progress_line(63, 62, 0.3, 1.0)


def test_a_benchmark_and_a_lab_of_parts_report_what_they_have():
    bench = parse_progress(progress_line(2, 3))
    assert (bench.loss, bench.samples_per_s, bench.describe()) == (None, None, "2/3 steps")
    lab = parse_progress(progress_line(1, 4, label="fsdp", unit="part"))
    assert lab.describe() == "fsdp · 1/4 parts" and lab.unit == "part"
    rate_only = parse_progress(progress_line(4, 9, samples_per_s=12.0))
    assert rate_only.describe() == "4/9 steps · 12 samples/s"
    with pytest.raises(ValueError, match="one word"):
        progress_line(1, 2, label="two words")
    with pytest.raises(ValueError, match="one of step, part"):
        progress_line(1, 2, unit="epoch")


def test_headless_prints_the_log_and_a_summary_not_each_progress_line(script, capsys, no_orphans):
    result = launch.torchrun(script, ["ok"], nproc=2, device="cpu", view=live.TextView("job"))
    shown = capsys.readouterr().out
    assert "[rank1] rank 1 says hello" in shown
    assert "progress:" not in shown, "progress lines feed the summary, not the printed log"
    assert "job: finished after" in shown
    assert "rank 0: 5/5 steps · 100 samples/s · loss 0.2" in shown
    assert "rank 1: 5/5 steps · 200 samples/s · loss 0.2" in shown
    assert result.log.count("progress: step 5/5") == 2, "the full log keeps every line"


def test_live_view_keeps_a_bar_per_rank_with_its_final_figures(script, no_orphans):
    job = None
    view = live.LiveView("torchrun job.py", lambda: job.request_stop())
    job = launch.Job(script, ["ok"], nproc=2, device="cpu", view=view)
    job.wait(timeout=120)
    assert sorted(view.bars) == [0, 1]
    for rank, (bar, label) in view.bars.items():
        assert (bar.value, bar.max) == (STEPS, STEPS)
        assert label.value == f"5/5 steps · {100 * (rank + 1)} samples/s · loss 0.2"
        assert bar.style.bar_color == live.rank_color(rank)
    assert [row.children[0] for row in view.bar_box.children] == [view.bars[0][0], view.bars[1][0]]
    assert f'color:{live.rank_color(1)}">[rank1] rank 1 says hello' in view.log.value
    assert "progress:" not in view.log.value
    assert view.status == "finished" and "✓ finished after" in view.header.value
    view.tick()  # time passing after the end leaves the final status alone
    assert "✓ finished after" in view.header.value
    assert view.stop_button.disabled


def test_stop_button_ends_the_job_and_frees_its_port(script, no_orphans):
    port = env.free_port()
    job = None
    view = live.LiveView("torchrun job.py", lambda: job.request_stop())
    job = launch.Job(script, ["hang"], nproc=2, device="cpu", port=port, view=view)

    def press_stop_once_both_ranks_report():
        deadline = time.monotonic() + 90
        while len(view.ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        view.stop_button.click()  # what a click in JupyterLab calls, from another thread too

    threading.Thread(target=press_stop_once_both_ranks_report, daemon=True).start()
    with pytest.raises(launch.JobStopped, match="Stop button"):
        job.wait(timeout=120)
    assert view.status == "stopped" and view.stop_button.description == "Stopped"
    assert all(bar.value == STEPS for bar, _ in view.bars.values()), "the bars stay"
    assert job.worker_pids() == [] and job.proc.poll() is not None
    assert env.port_is_free(port)


def test_widgets_shown_only_where_a_front_end_draws_them(monkeypatch):
    monkeypatch.delenv(frontend.ENV, raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", "x.ipynb")
    assert frontend.widgets_shown() is False, "no kernel here (pytest): nothing draws widgets"
    monkeypatch.setenv(frontend.ENV, "1")
    assert frontend.widgets_shown() is True
    monkeypatch.setenv(frontend.ENV, "yes")
    with pytest.raises(ValueError, match="set it to 1"):
        frontend.widgets_shown()


def test_a_click_is_routed_to_the_subshell_again():
    class Widget:
        comm = type("Comm", (), {})()

    widget = Widget()
    widget.comm._reply_subshell_id = None  # ipykernel 7.4 learned "the main shell"
    live.answer_while_busy(widget)
    assert not hasattr(widget.comm, "_reply_subshell_id")
    live.answer_while_busy(object())  # no comm: nothing to forget


def test_the_live_view_speaks_the_readers_language(monkeypatch):
    """A zh_CN notebook's bars, status and buttons in Chinese; the launcher's status words
    (kept in English in the ledger) are translated for display only."""
    monkeypatch.setenv("MULTIGPU_LAB_LANG", "zh_CN")
    view = live.LiveView("torchrun job.py", lambda: None)
    assert view.stop_button.description == "停止" and "运行中" in view.header.value
    assert view.progress("[rank0] " + progress_line(5, 5, 0.2, 100.0))
    bar, label = view.bars[0]
    assert bar.description == "rank 0" and label.value == "5/5 步 · 100 样本/秒 · loss 0.2"
    view.finish("failed (exit code 1)", 3.25)
    assert "✗ 失败（退出码 1），用时 3.2 秒" in view.header.value
    assert view.stop_button.description == "完成"
    assert live.status_text("timed out (60 s limit)") == "超时（时限 60 秒）"
    assert live.status_text("stopped") == "已停止"
    text = live.TextView("job")
    text.progress("[rank1] " + progress_line(2, 4, 0.5, 10.0))
    text.status = "finished"
    assert text.summary(1.0) == [
        "job：已完成，用时 1.0 秒；各 rank 最后的进度：",
        "  rank 1: 2/4 步 · 10 样本/秒 · loss 0.5",
    ]
