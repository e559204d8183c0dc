"""`zeroserve keys generate`: key pairs, never a secret key in a git work tree's folder git does not ignore
unless forced."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth

from service.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def test_a_key_pair_outside_any_work_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "generate", "--dir", str(tmp_path / "keys"), "--name", "engine-1"]) == 0
    public, secret = zmq.auth.load_certificate(tmp_path / "keys" / "engine-1.key_secret")
    assert secret is not None and zmq.auth.load_certificate(tmp_path / "keys" / "engine-1.key") == (public, None)
    assert stat.S_IMODE((tmp_path / "keys" / "engine-1.key_secret").stat().st_mode) == 0o600
    assert str(tmp_path / "keys" / "engine-1.key_secret") in capsys.readouterr().out


def test_inside_a_git_work_tree_it_refuses_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".git").mkdir()
    keys = tmp_path / "deploy" / "keys"
    assert main(["keys", "generate", "--dir", str(keys)]) == 2
    error = capsys.readouterr().err
    assert str(tmp_path) in error and "--force" in error
    assert not keys.exists()
    assert main(["keys", "generate", "--dir", str(keys), "--force"]) == 0
    assert (keys / "gateway.key_secret").is_file()


def test_an_ignored_folder_of_a_work_tree_is_allowed_and_one_git_would_add_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    subprocess.run(["git", "init", "--quiet", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("deploy/keys/\n")
    assert main(["keys", "generate", "--dir", str(tmp_path / "deploy" / "keys")]) == 0
    assert (tmp_path / "deploy" / "keys" / "gateway.key_secret").is_file()
    assert main(["keys", "generate", "--dir", str(tmp_path / "deploy" / "other")]) == 2
    error = capsys.readouterr().err
    assert "git does not ignore it" in error and "--force" in error
    assert not (tmp_path / "deploy" / "other").exists()


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs this project's git checkout")
@pytest.mark.parametrize("folder", ["keys", "deploy/keys"])
def test_the_checkouts_key_folders_are_ignored_by_git(folder: str) -> None:
    result = subprocess.run(
        ["git", "check-ignore", "--no-index", f"{folder}/gateway.key_secret"], cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 0, (sys.executable, result.stderr)


def test_an_existing_key_pair_is_not_replaced_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    assert main(["keys", "generate", "--dir", str(keys)]) == 0
    first = (keys / "gateway.key_secret").read_bytes()
    assert main(["keys", "generate", "--dir", str(keys)]) == 2
    assert "gateway.key exists" in capsys.readouterr().err
    assert (keys / "gateway.key_secret").read_bytes() == first
    assert main(["keys", "generate", "--dir", str(keys), "--force"]) == 0
    assert (keys / "gateway.key_secret").read_bytes() != first
