"""What the helpers print follows the reader's language, from complete gettext catalogs."""

from __future__ import annotations

import ast
import os
import re

import pytest

from helpers import exercise, messages
from labtools import message_catalog

LANG = "zh_CN"
LOCALE_VARS = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG", messages.LANG_ENV, messages.SESSION_ENV)


@pytest.fixture
def english_machine(monkeypatch, tmp_path):
    """A machine with an English locale, working outside the notebooks."""
    for var in LOCALE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.chdir(tmp_path)
    messages._edition_of.cache_clear()
    return monkeypatch


def verdict(capsys) -> str:
    exercise.equal("00.1", 35, 36, hint="MAX keeps the largest rank + 1")
    return capsys.readouterr().out


def test_english_by_default(english_machine, capsys):
    assert verdict(capsys).startswith("❌ Exercise 00.1: not yet. Your answer was 35.")


def test_the_variable_chooses_chinese(english_machine, capsys):
    english_machine.setenv(messages.LANG_ENV, LANG)
    out = verdict(capsys)
    assert out.startswith("❌ 练习 00.1：还不对。你的答案是 35。")
    assert "提示：MAX 保留最大的 rank + 1" in out  # the lesson's hint, translated


def test_the_system_locale_chooses_chinese(english_machine, capsys):
    english_machine.setenv("LANG", "zh_CN.UTF-8")
    assert "练习 00.1" in verdict(capsys)


def test_en_overrides_a_chinese_locale(english_machine, capsys):
    english_machine.setenv("LANG", "zh_CN.UTF-8")
    english_machine.setenv(messages.LANG_ENV, "en")
    assert "Exercise 00.1" in verdict(capsys)


def test_a_kernel_in_the_chinese_edition_answers_in_chinese(english_machine, tmp_path, capsys):
    (tmp_path / LANG / "work").mkdir(parents=True)
    english_machine.chdir(tmp_path / LANG / "work")  # a torchrun worker's folder, too
    assert "练习 00.1" in verdict(capsys)


def test_a_chinese_notebook_keeps_its_language_in_its_run_folder(english_machine, tmp_path, capsys):
    from helpers import params

    english_machine.setenv(messages.LANG_ENV, "")  # unset, and restored after the test
    (tmp_path / LANG).mkdir()
    english_machine.chdir(tmp_path / LANG)  # where JupyterLab starts a zh_CN notebook's kernel
    params.use_run_folder("00_environment", tmp_path / "run")  # the notebook's second cell
    assert "练习 00.1" in verdict(capsys) and os.environ[messages.LANG_ENV] == LANG


def notebook_file(path, edition: str | None = None):
    """A notebook as labtools.i18n writes it: a translated one names its edition."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    if edition:
        nb.metadata[messages.META_KEY] = {"edition": edition}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def test_a_kernel_of_a_chinese_notebook_answers_in_chinese_from_any_folder(
    english_machine, tmp_path, capsys
):
    """JupyterLab names the notebook in the kernel's JPY_SESSION_NAME; the copy lies in a
    folder named like no edition (a browser test's, a learner's own) and the kernel works in
    its run folder, without the variable helpers.params sets."""
    lesson = notebook_file(tmp_path / "course" / "00_environment.ipynb", LANG)
    english_machine.setenv(messages.SESSION_ENV, str(lesson))
    (tmp_path / "runs" / "x").mkdir(parents=True)
    english_machine.chdir(tmp_path / "runs" / "x")
    assert "练习 00.1" in verdict(capsys)
    assert i18n_metadata_is_what_the_build_writes()


def i18n_metadata_is_what_the_build_writes() -> bool:
    from labtools import i18n

    built = i18n.translated_notebook(LANG, "00_environment")
    return built.metadata[messages.META_KEY] == {"edition": LANG}


@pytest.mark.parametrize("edition", [None, "fr_FR"])
def test_an_english_notebook_or_an_unknown_edition_stays_english(
    english_machine, tmp_path, capsys, edition
):
    lesson = notebook_file(tmp_path / "course" / "00_environment.ipynb", edition)
    english_machine.setenv(messages.SESSION_ENV, str(lesson))
    assert verdict(capsys).startswith("❌ Exercise 00.1")


def test_a_session_notebook_deleted_since_still_counts_its_folder(
    english_machine, tmp_path, capsys
):
    english_machine.setenv(messages.SESSION_ENV, str(tmp_path / LANG / "gone.ipynb"))
    assert "练习 00.1" in verdict(capsys)
    english_machine.setenv(messages.SESSION_ENV, str(tmp_path / "en" / "gone.ipynb"))
    assert "Exercise 00.1" in verdict(capsys)


def test_the_doctor_gives_its_hints_in_chinese(english_machine):
    from helpers import env

    english_machine.setenv(messages.LANG_ENV, LANG)
    gpus = env.GPUInfo("none", error="no driver")
    [check_] = env._gpu_checks(gpus, {"cuda_build": None, "nccl": None})
    assert check_.status == env.WARN and "看不到 NVIDIA GPU" in check_.detail
    assert "gloo" in check_.hint and "学习不受影响" in check_.hint


# ---------------------------------------------------------------- the catalog itself


def test_translations_keep_every_placeholder():
    for m in message_catalog.read_catalog(LANG):
        if m.id:
            fields = set(re.findall(r"\{[^}]*\}", m.id))
            assert set(re.findall(r"\{[^}]*\}", m.string)) == fields, m.id
            assert m.string.startswith("\n") == m.id.startswith("\n"), m.id


def test_every_wrapped_string_is_seen_by_the_extractor():
    """A `_()` inside an f-string is invisible to babel (before Python 3.12), so never found."""
    extracted = {m.id for m in message_catalog.template()}
    for path in sorted(messages.LOCALE_DIR.parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        wrapped = {
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "_"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        }
        assert wrapped <= extracted, f"{path.name}: {wrapped - extracted} cannot be extracted"


def test_a_notebooks_reason_for_changing_a_parameter_is_said_in_chinese(english_machine, capsys):
    """The reason is a template in notebook 02's shared code cell; the catalog holds it."""
    from helpers import params

    english_machine.setenv(messages.LANG_ENV, LANG)
    why = "the run has {steps} steps and rank 1 must fail before the last"
    assert params.adjusted("fail_at_step", 30, 14, why=why, steps=15) == 14
    assert capsys.readouterr().out == (
        "fail_at_step：使用 14 而不是 30，因为这次运行只有 15 步，rank 1 必须在最后一步之前失败。\n"
    )
