"""scripts/commit-msg, the hook the README asks contributors to install: a subject of at most
72 characters, and a blank line before a body."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ops_support import ROOT

HOOK = ROOT / "scripts" / "commit-msg"
INSTALL = "ln -s ../../scripts/commit-msg .git/hooks/commit-msg"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "message",
    [
        "Wallet: holds expire by their own deadline\n",
        "Wallet: holds expire by their own deadline\n\nThe sweeper read the table's deadline.\n",
        "百變牛牛 (the Bull with jokers): seventy-two characters, more than 72 bytes.\n",
        "Short subject\n\nBody.\n# Please enter the commit message for your changes.\n# " + "x" * 90 + "\n",
        "Short subject\n# ------------------------ >8 ------------------------\n" + "diff " * 40 + "\n",
    ],
)
def test_a_good_message_passes(tmp_path: Path, message: str) -> None:
    done = check(tmp_path, message)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("x" * 73 + "\n", "the subject is 73 characters, at most 72"),
        ("Subject\nbody right under it\n", "leave a blank line before the body"),
        ("# only a comment\n\n", "the message is empty"),
    ],
)
def test_a_bad_message_is_refused_with_its_reason(tmp_path: Path, message: str, reason: str) -> None:
    done = check(tmp_path, message)
    assert done.returncode == 1
    assert reason in done.stderr


def test_installed_as_the_readme_says_it_refuses_a_commit(tmp_path: Path) -> None:
    assert INSTALL in (ROOT / "README.md").read_text()
    git = shutil.which("git")
    assert git is not None
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(HOOK, repo / "scripts" / "commit-msg")
    who = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([git, "init", "-q", str(repo)], check=True, timeout=30)
    subprocess.run(INSTALL.split(), cwd=repo, check=True, timeout=30)
    refused = subprocess.run(
        [git, *who, "commit", "-q", "--allow-empty", "-m", "y" * 80],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0 and "at most 72" in refused.stderr
    subprocess.run(
        [git, *who, "commit", "-q", "--allow-empty", "-m", "A subject", "-m", "A body."],
        cwd=repo,
        check=True,
        timeout=30,
    )
