"""The translated editions: built from the English notebooks, never allowed to fall behind them."""

from __future__ import annotations

import json
import re

import mistune
import nbformat
import pytest

from labtools import i18n, translation_worksheets
from labtools import translate as translate_cli

LANG = "zh_CN"
STEMS = i18n.english_stems()
STEM = "02_distributed_data_parallel"  # the lesson run in Chinese (conftest's classroom)


# ---------------------------------------------------------------- the mechanism, on a toy lesson


@pytest.fixture
def lesson(tmp_path, monkeypatch):
    """A two-section notebook in a notebooks/ folder of its own, with no translation yet."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    monkeypatch.setattr(i18n, "NOTEBOOKS", notebooks)
    monkeypatch.setattr(i18n, "TRANSLATIONS", notebooks / "i18n")
    v4 = nbformat.v4
    params = v4.new_code_cell("quick = False", metadata={"tags": ["parameters"]})
    nb = v4.new_notebook(
        cells=[
            v4.new_markdown_cell("# 00 · Demo\n\n**What you will learn**: `all_reduce`"),
            params,
            v4.new_markdown_cell("## Why"),
            v4.new_code_cell("print(1)"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(nb, notebooks / "00_demo.ipynb")
    return notebooks / "00_demo.ipynb"


def translate(stem: str = "00_demo", cell: str | None = None, text: str = "中文 {n}") -> None:
    """Fill a worksheet the way a translator would, and import it."""
    sheet = translation_worksheets.export(LANG, [stem], todo=cell is None, cell=cell)
    blocks = sheet.split("<!-- i18n ")[1:]
    translated = [
        "<!-- i18n " + block.split("\n", 1)[0] + "\n" + text.format(n=n)
        for n, block in enumerate(blocks)
    ]
    translation_worksheets.import_worksheet(LANG, "\n\n".join(translated))


def test_build_translates_markdown_and_copies_everything_else(lesson, tmp_path):
    translate()
    assert i18n.build(LANG) == {"00_demo": "written"}
    english = nbformat.read(lesson, as_version=4)
    built = nbformat.read(lesson.parent / LANG / "00_demo.ipynb", as_version=4)
    assert [c.source for c in built.cells if c.cell_type == "markdown"] == ["中文 0", "中文 1"]
    assert built.metadata == {**english.metadata, "multigpu_lab": {"edition": LANG}}
    for en, zh in zip(english.cells, built.cells, strict=True):
        assert (zh.id, zh.cell_type, zh.metadata) == (en.id, en.cell_type, en.metadata)
        if en.cell_type == "code":
            assert zh == en


def test_changed_english_makes_its_translation_stale_and_the_english_stands_in(lesson):
    translate()
    nb = nbformat.read(lesson, as_version=4)
    nb.cells[2].source = "## Why it matters"
    nbformat.write(nb, lesson)
    state = i18n.state_of(LANG, "00_demo")
    assert state.stale == [nb.cells[2].id] and not state.complete
    i18n.build(LANG)
    built = nbformat.read(lesson.parent / LANG / "00_demo.ipynb", as_version=4)
    # never an outdated translation: the new English, under a banner that says why
    assert built.cells[2].source == f"## Why it matters\n\n{i18n.BANNER[LANG]['stale']}"
    assert i18n.translation_text(LANG, "00_demo", i18n.load(LANG, "00_demo"), nb).endswith(
        f'"todo": {{\n  "{nb.cells[2].id}": "stale"\n }}\n}}\n'
    )  # what make sync writes into the translation file, for review
    report, complete = i18n.status_report(LANG)
    assert not complete and nb.cells[2].id in report and "stale" in report
    sheet = translation_worksheets.export(LANG, ["00_demo"], todo=True)
    assert "<!-- English now:\n## Why it matters\n-->" in sheet and "中文 1" in sheet


def test_added_markdown_cell_is_missing_until_translated(lesson):
    translate()
    nb = nbformat.read(lesson, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("## Summary"))
    nbformat.write(nb, lesson)
    assert i18n.state_of(LANG, "00_demo").missing == [nb.cells[-1].id]
    built = i18n.translated_notebook(LANG, "00_demo")
    assert built.cells[-1].source == f"## Summary\n\n{i18n.BANNER[LANG]['missing']}"
    translate()
    assert i18n.state_of(LANG, "00_demo").complete


def test_a_deleted_cells_translation_goes_at_the_next_import(lesson):
    translate()
    nb = nbformat.read(lesson, as_version=4)
    gone = nb.cells.pop(2).id
    nbformat.write(nb, lesson)
    assert i18n.state_of(LANG, "00_demo").orphans == [gone]
    translate(cell=nb.cells[0].id, text="# 00 · 演示")
    assert gone not in i18n.load(LANG, "00_demo")
    assert i18n.state_of(LANG, "00_demo").orphans == []


def test_a_cell_without_an_id_is_refused_with_the_fix(lesson):
    raw = json.loads(lesson.read_text())
    del raw["cells"][2]["id"]
    lesson.write_text(json.dumps(raw))
    with pytest.raises(i18n.I18nError, match="cell 2 has no id.*JupyterLab"):
        i18n.build(LANG)


def test_one_entry_can_be_updated_alone(lesson):
    translate()
    title = nbformat.read(lesson, as_version=4).cells[0].id
    translate(cell=title, text="# 00 · 演示")
    entries = i18n.load(LANG, "00_demo")
    assert entries[title]["text"] == ["# 00 · 演示"]
    assert [e["text"] for e in entries.values()][1] == ["中文 1"]


def test_a_block_left_in_english_is_not_stored(lesson):
    stored, skipped = translation_worksheets.import_worksheet(
        LANG, translation_worksheets.export(LANG, ["00_demo"])
    )
    assert stored == [] and len(skipped) == 2 and i18n.load(LANG, "00_demo") == {}


def test_build_keeps_a_notebook_the_reader_changed(lesson):
    translate()
    i18n.build(LANG)
    built = lesson.parent / LANG / "00_demo.ipynb"
    nb = nbformat.read(built, as_version=4)
    nb.cells[3].source = "print('my experiment')"
    nbformat.write(nb, built)
    assert i18n.build(LANG) == {"00_demo": "kept"}
    assert "my experiment" in built.read_text()
    assert i18n.build(LANG, force=True) == {"00_demo": "written"}
    assert i18n.build(LANG) == {"00_demo": "unchanged"}


def test_status_check_fails_until_everything_is_translated(lesson, capsys):
    assert translate_cli.main(["status", LANG, "--check"]) == 1
    assert "export zh_CN --todo" in capsys.readouterr().out
    translate()
    assert translate_cli.main(["status", LANG, "--check"]) == 0


# ---------------------------------------------------------------- the real lessons


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp(LANG)
    i18n.build(LANG, out=out)
    return out


@pytest.mark.parametrize("stem", STEMS)
def test_english_stands_in_under_a_banner_where_the_translation_waits(stem, built):
    """A reader of the edition always sees which paragraphs are not translated yet; the
    translation file's todo (written by make sync, tests/test_sync.py) lists the same cells."""
    state = i18n.state_of(LANG, stem)
    waiting = set(state.stale + state.missing)
    zh = nbformat.read(built / f"{stem}.ipynb", as_version=4)
    flagged = {c.id for c in zh.cells if any(b in c.source for b in i18n.BANNER[LANG].values())}
    assert flagged == waiting


@pytest.mark.parametrize("stem", STEMS)
def test_built_edition_runs_exactly_the_english_code(stem, built):
    english = nbformat.read(i18n.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    zh = nbformat.read(built / f"{stem}.ipynb", as_version=4)
    assert zh.metadata == {**english.metadata, "multigpu_lab": {"edition": LANG}}
    assert [(c.id, c.cell_type, c.metadata) for c in zh.cells] == [
        (c.id, c.cell_type, c.metadata) for c in english.cells
    ]
    differ = [
        c.id
        for c, e in zip(zh.cells, english.cells, strict=True)
        if c.cell_type == "code" and c != e
    ]
    assert not differ, f"{stem}: code cells {differ} differ from the English notebook"
    assert not any(c.get("outputs") or c.get("execution_count") for c in zh.cells)


def _outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def structure(text: str) -> dict[str, object]:
    """What a translation must keep: headings, links, code blocks, formulas, tables, code names."""
    prose = _outside_fences(text)
    return {
        "headings": re.findall(r"^(#{1,6}) ", prose, re.M),
        "links": sorted(re.findall(r"\]\(([^)\s]+)\)", prose)),
        "fences": re.findall(r"^```.*?^```", text, re.M | re.S),
        "math": sorted(re.findall(r"\$[^$`\n]+\$", prose)),
        "table rows": len(re.findall(r"^\s*\|", prose, re.M)),
    }


@pytest.mark.parametrize("stem", STEMS)
def test_translations_keep_the_markdown_structure_and_the_api_names(stem):
    english = {c.id: c.source for c in i18n.read_english(stem).cells if c.cell_type == "markdown"}
    for cid, entry in i18n.load(LANG, stem).items():
        en, zh = english[cid], "\n".join(entry["text"])
        assert structure(zh) == structure(en), f"{stem}/{cid}: structure changed"
        code_names = set(re.findall(r"`[^`\n]+`", _outside_fences(en)))
        lost = code_names - set(re.findall(r"`[^`\n]+`", _outside_fences(zh)))
        assert not lost, f"{stem}/{cid}: code names dropped from the translation: {lost}"


@pytest.mark.parametrize("stem", STEMS)
def test_translated_first_cell_keeps_the_anatomy(stem):
    first = i18n.read_english(stem).cells[0]
    title = "\n".join(i18n.load(LANG, stem)[first.id]["text"])
    assert title.startswith(f"# {stem[:2]} · ") and "**你将学到**" in title


def _literal_asterisks(markdown: str) -> bool:
    """Whether nbconvert's renderer (mistune) leaves ``**`` as text: CommonMark closes bold
    only after a non-punctuation character or before a space or punctuation, so
    ``**正确做法：**在`` stays literal in JupyterLab and nbconvert alike."""
    html = mistune.create_markdown()(markdown)
    return "**" in re.sub(r"<code>.*?</code>|<pre>.*?</pre>", "", html, flags=re.S)


@pytest.mark.parametrize("stem", STEMS)
def test_bold_renders_in_both_editions(stem):
    english = {c.id: c.source for c in i18n.read_english(stem).cells if c.cell_type == "markdown"}
    texts = {f"en/{cid}": text for cid, text in english.items()}
    texts |= {f"zh/{cid}": "\n".join(e["text"]) for cid, e in i18n.load(LANG, stem).items()}
    broken = sorted(key for key, text in texts.items() if _literal_asterisks(text))
    assert not broken, f"{stem}: bold shown as asterisks in {broken} (put the colon outside)"


# notebooks/i18n/zh_CN/GLOSSARY.md's key terms: where the English cell names the idea, the
# translation uses the glossary's word (issue 44 found 检查点 alone for activation checkpointing,
# 内核 for CPU cores, 存储 for the c10d store).
KEY_TERMS = {
    r"activation checkpointing": "激活检查点",
    r"pinned|page-locked": "锁页",
    r"process group": "进程组",
    r"gradient accumulation": "梯度累积",
    r"mixed precision": "混合精度",
    r"micro-batch": "微批次",
    r"data parallel": "数据并行",
    r"network namespace": "网络命名空间",
    r"bus bandwidth": "总线带宽",
    r"orphan": "孤儿",
}
WRONG = {  # a wording the glossary replaced -> why
    "CPU 内核": "CPU cores are CPU 核心; 内核 is Jupyter's kernel (GLOSSARY.md)",
    "c10d 存储": "the c10d store stays store; 存储 reads as storage beside 共享存储",
    "位有效数字": "bf16 keeps 8 significant bits (有效位), 2-3 decimal digits",
}


@pytest.mark.parametrize("stem", STEMS)
def test_the_translation_follows_the_glossary(stem):
    english = {c.id: c.source for c in i18n.read_english(stem).cells if c.cell_type == "markdown"}
    for cid, entry in i18n.load(LANG, stem).items():
        en, zh = english[cid], "\n".join(entry["text"])
        for term, word in KEY_TERMS.items():
            if re.search(term, en, re.I):
                assert word in zh, f"{stem}/{cid}: '{term}' is {word} in the glossary"
        for wrong, why in WRONG.items():
            assert wrong not in zh, f"{stem}/{cid}: {wrong!r}: {why}"


@pytest.mark.notebook
def test_the_chinese_edition_reads_and_answers_in_chinese(notebook_run):
    outcome = notebook_run(STEM, LANG)
    assert outcome.status == "ok", outcome.error
    assert outcome.output.endswith(f"{STEM}.ipynb")
    executed = nbformat.read(outcome.output, as_version=4)
    assert "**你将学到**" in executed.cells[0].source
    printed = "".join(
        o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs
    )
    for exercise in ("02.1", "02.2"):
        assert f"✅ 练习 {exercise}：正确" in printed, f"{exercise} not answered in Chinese"
    for helper_line in ("本次运行的文件夹", "各 rank 最后的进度", "步 · ", "已写入 "):
        assert helper_line in printed, f"the helpers did not say {helper_line!r} in Chinese"


def test_the_chinese_student_copy_stubs_the_solutions_of_the_chinese_edition(tmp_path):
    from labtools import student

    counts = student.write_student_copy(tmp_path / LANG, lang=LANG)
    english = student.write_student_copy(tmp_path / "en")
    assert counts == english and sum(counts.values()) > 0
    first = nbformat.read(tmp_path / LANG / "00_environment.ipynb", as_version=4)
    assert "**你将学到**" in first.cells[0].source
    assert not any("solution" in c.metadata.get("tags", []) for c in first.cells)


def test_make_lab_in_chinese_defaults_jupyterlab_to_the_installed_language_pack(tmp_path):
    from jupyterlab.labapp import LabApp
    from jupyterlab_server.settings_utils import get_settings
    from jupyterlab_server.translation_utils import get_language_packs

    overrides = i18n.TRANSLATIONS / LANG / "jupyterlab"
    plugin = "@jupyterlab/translation-extension:plugin"
    settings, _ = get_settings(str(overrides), LabApp().schemas_dir, str(tmp_path), plugin)
    assert settings["schema"]["properties"]["locale"]["default"] == LANG
    assert LANG in get_language_packs()[0], "pip install jupyterlab-language-pack-zh-CN"
    makefile = (i18n.NOTEBOOKS.parent / "Makefile").read_text()
    assert "--LabApp.app_settings_dir=$(abspath notebooks/i18n/$(EDITION)/jupyterlab)" in makefile


def test_the_runner_refuses_an_edition_without_translations(capsys):
    from labtools import runner

    with pytest.raises(SystemExit):
        runner.main(["--lang", "fr_FR"])
    assert "invalid choice: 'fr_FR'" in capsys.readouterr().err and LANG in i18n.editions()


def test_links_are_rewritten_for_the_editions_folder(tmp_path, monkeypatch):
    """The edition sits in notebooks/zh_CN/: a link written from notebooks/ gains ``../``, and
    a translated note replaces the English one; links that already work are left alone."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "teardown.md").write_text("en")
    (tmp_path / "notes" / "teardown.zh_CN.md").write_text("zh")
    (tmp_path / "notes" / "memory.md").write_text("en, not translated")
    monkeypatch.setattr(i18n, "NOTEBOOKS", tmp_path)
    text = "[a](notes/teardown.md#why) [b](notes/memory.md) [c](https://pytorch.org) [d](#top)"
    assert i18n.one_folder_down(text, "zh_CN") == (
        "[a](../notes/teardown.zh_CN.md#why) [b](../notes/memory.md) "
        "[c](https://pytorch.org) [d](#top)"
    )
