"""How nnwatch reaches another host: the config file's per-host defaults under the command line's
flags, and the ``sh`` step that finds nnwatch there through the runs' own Python, run here by
real shells (dash, bash) as a login shell over ssh would run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nnwatch.cli._config import ConfigError, host_settings, ssh_options
from nnwatch.sources.remote_command import NOT_FOUND, explain_failure, remote_command

CONFIG = """
[remote]
ssh_args = ["-o", "ConnectTimeout=10"]

[hosts.gpu-host]
remote_nnwatch = "~/venv/bin/python -m nnwatch"
ssh_args = ["-p", "2222"]
root = "/scratch/me/nnwatch"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    monkeypatch.setenv("NNWATCH_CONFIG", str(path))
    return path


def test_a_host_table_over_the_defaults_and_the_flags_over_both(config: Path) -> None:
    got = host_settings("gpu-host")
    assert got.remote_nnwatch == "~/venv/bin/python -m nnwatch"
    assert got.ssh_args == ("-o", "ConnectTimeout=10", "-p", "2222")
    assert got.root == "/scratch/me/nnwatch"
    assert host_settings("me@gpu-host").root == "/scratch/me/nnwatch"  # user@ finds the host
    other = ssh_options("other")
    assert other == {"ssh": "ssh", "ssh_args": ["-o", "ConnectTimeout=10"],
                     "remote_nnwatch": None, "remote_root": None}  # fmt: skip
    flagged = ssh_options("gpu-host", ssh="myssh", ssh_args=["-v"], remote_nnwatch="nnw")
    assert flagged["ssh"] == "myssh" and flagged["remote_nnwatch"] == "nnw"
    assert flagged["ssh_args"] == ["-o", "ConnectTimeout=10", "-p", "2222", "-v"]


def test_no_config_file_is_no_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNWATCH_CONFIG", str(tmp_path / "none.toml"))
    assert ssh_options("h") == {
        "ssh": "ssh",
        "ssh_args": [],
        "remote_nnwatch": None,
        "remote_root": None,
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[hosts.h]\nremote = 'x'\n", "unknown key 'remote'"),
        ("[hosts.h]\nssh_args = '-p 2'\n", "ssh_args must be a list of strings"),
        ("[host.h]\nroot = 'x'\n", "unknown table 'host'"),
        ("[hosts.h\n", "not valid TOML"),
    ],
)
def test_a_mistake_in_the_file_is_named_with_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, words: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("NNWATCH_CONFIG", str(path))
    with pytest.raises(ConfigError, match=words) as err:
        host_settings("h")
    assert str(path) in str(err.value)


def test_the_cli_reports_a_bad_config_in_words(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[hosts.h]\nport = 22\n")
    done = subprocess.run(
        [sys.executable, "-m", "nnwatch", "pull", "h:run"], capture_output=True, text=True,
        env={"NNWATCH_CONFIG": str(path), "PATH": "/usr/bin:/bin"}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "unknown key 'port'" in done.stderr and "Traceback" not in done.stderr


def _entry(root: Path, name: str, executable: str) -> None:
    reg = root / "registry"
    reg.mkdir(parents=True, exist_ok=True)
    (reg / f"{name}.json").write_text(json.dumps({"executable": executable}, indent=1))


#: The login shells ssh may hand the step to (those installed here; fish and csh quote alike).
SHELLS = [s for s in ("dash", "bash", "sh", "zsh", "fish", "tcsh") if shutil.which(s)]


@pytest.mark.parametrize("shell", SHELLS)
def test_the_step_runs_nnwatch_with_the_python_a_run_names(shell: str, tmp_path: Path) -> None:
    """As ssh hands it to a login shell: found through the registry, with no PATH at all."""
    root = tmp_path / "root with space"
    _entry(root, "gone", "/nowhere/bin/python")  # a venv deleted since: skipped
    _entry(root, "here", sys.executable)
    cmd = remote_command(["ls", "--json", "--all"], root=str(root))
    done = subprocess.run(
        [shutil.which(shell) or shell, "-c", cmd], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []  # nnwatch ran (the entries are not runs)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_step_says_so_when_nothing_there_runs_nnwatch(shell: str, tmp_path: Path) -> None:
    cmd = remote_command(["ls", "--json"], root=str(tmp_path / "empty"))
    done = subprocess.run(
        [shutil.which(shell) or shell, "-c", cmd], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 127 and NOT_FOUND in done.stderr, done.stderr
    text = explain_failure("gpu-host", done.returncode, done.stderr, None)
    assert "nnwatch is not installed on gpu-host" in text and "pip install nnwatch" in text


def test_a_named_command_is_used_as_it_is() -> None:
    assert remote_command(["pack", "my run"], remote_nnwatch="~/v/bin/nnwatch") == (
        "~/v/bin/nnwatch pack 'my run'"
    )
    assert remote_command(["ls"], remote_nnwatch="nnw", root="/r") == "nnw ls --root /r"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_word_with_quotes_and_spaces_arrives_whole(shell: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    _entry(root, "here", sys.executable)
    word = 'it\'s a $run; `x` "y"'
    cmd = remote_command(["ctl", word, "hello"], root=str(root))
    done = subprocess.run(
        [shutil.which(shell) or shell, "-c", cmd], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"no registered run matches {word!r}" in done.stderr, done.stderr
