"""The history stays readable: `git log --oneline` shows whole subjects (issue 46)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers.paths import REPO_ROOT

# The last commit before the rule: earlier subjects ran to 853 characters and stay as they are.
RULE_SINCE = "a137249"
SUBJECT_MAX = 72


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)


def test_every_commit_subject_fits_on_one_line():
    """A subject of at most 72 characters; the story goes in the body."""
    if shutil.which("git") is None or git("cat-file", "-e", f"{RULE_SINCE}^{{commit}}").returncode:
        pytest.skip(f"no history here (a tarball, or a shallow clone without {RULE_SINCE})")
    log = git("log", "--format=%h %s", f"{RULE_SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    long = [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[1]) > SUBJECT_MAX]
    assert not long, f"subjects over {SUBJECT_MAX} characters (reword them):\n" + "\n".join(long)
