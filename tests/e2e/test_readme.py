"""Every command in the README and the manual (docs/) runs as written, or as the command it
stands for.

The first test pins their shell lines to this file, so an edit that adds or changes a command
fails here until the command is checked below.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

NNWATCH = [sys.executable, "-m", "nnwatch"]

#: Each README shell line, and where it is checked (a test here, or the test that covers it).
COVERED = {
    "make demo": "test_make_demo_stands_for_the_exploding_demo (+ tests/e2e/test_journey*.py in tmux)",
    "make test": "test_make_test_runs_this_suite",
    "nnwatch": "test_monitor_commands_find_a_live_run (+ the picker's Pilot tests)",
    "nnwatch ls": "test_monitor_commands_find_a_live_run",
    "nnwatch attach mnist-mlp": "test_monitor_commands_find_a_live_run (+ tests/tui/test_tui_live.py)",
    "nnwatch ls --json | grep socket": "test_monitor_commands_find_a_live_run",
    "ssh -N -L /tmp/run.sock:/dev/shm/nnwatch-1000/s/12345-r0.sock gpu-host &": "tests/e2e/test_ssh_forward.py",
    "nnwatch attach --connect /tmp/run.sock": "tests/e2e/test_ssh_forward.py",
    "nnwatch attach gpu-host:mnist-mlp": "tests/e2e/test_remote_ssh.py (HOST:RUN through a real sshd)",
    "nnwatch gpu-host": "tests/e2e/test_remote_picker.py (the runs on a host through a real sshd: picker and text)",
    "nnwatch attach --job JOB --hosts node01,node02": (
        "tests/e2e/test_job_multinode.py (the fan-out and job screen it runs, two sshd 'nodes')"
    ),
    "nnwatch ls --all node01 node02": (
        "tests/e2e/test_job_story.py (ls over two sshd 'nodes': the whole job's story)"
    ),
    "nnwatch open JOB --hosts node01,node02": (
        "tests/e2e/test_job_story.py (open job --hosts node0,node1 in tmux, after the teardown)"
    ),
    "nnwatch stacks JOB --hosts node01,node02": (
        "tests/e2e/test_job_story.py (a rank stuck, the others in the all-reduce, two sshd 'nodes')"
    ),
    "nnwatch demo nan_log --headless --keep": "test_snapshot_and_replay_commands",
    "nnwatch replay RUN_DIR --model nnwatch.demos.nan_log:make --anomaly": "test_snapshot_and_replay_commands",
    "nnwatch check tests.fixtures.check_factories:healthy": "test_check_command",
    "nnwatch show RUN_DIR/snapshots/step-40": "tests/integration/test_cli_show.py (text report of a real snapshot)",
    "nnwatch show RUN_DIR --json --model nnwatch.demos.nan_log:make --decode mytok:decode": (
        "tests/integration/test_cli_show.py (--json with a model factory and a decoder)"
    ),
    "pip install nnwatch": (
        "tests/e2e/test_wheel_without_torch.py (the wheel of this repository, with its dependency "
        "list, into a fresh venv: no torch comes with it)"
    ),
    "pipx install nnwatch": (
        "tests/e2e/test_wheel_without_torch.py (pipx makes a venv of its own for the same wheel: "
        "the test does that, and runs the monitor commands there)"
    ),
    "nnwatch ctl gpu-host:mnist-mlp pause": (
        "tests/e2e/test_remote_no_config.py (ctl HOST:RUN pause through a real sshd)"
    ),
    "torchrun --standalone --nproc-per-node 8 train.py": (
        "tests/integration/test_distributed_ddp.py (torch.distributed.run --standalone, 2 ranks)"
    ),
    "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr node01 --master-port 29500 train.py": (
        "tests/e2e/test_job_multinode.py (two torchrun --nnodes 2 --node-rank N invocations)"
    ),
}

#: The front page's limit; the manual is in docs/.
README_MAX_LINES = 250


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_commands() -> list[str]:
    text = "\n".join(p.read_text() for p in documents())
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_every_readme_command_is_checked() -> None:
    commands = readme_commands()
    assert commands, "the README has no shell commands"
    assert sorted(set(commands)) == sorted(COVERED), "README commands and their checks drifted apart"


def test_the_front_page_is_short_links_the_manual_and_its_loop_can_stop() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    loop = re.search(r"```python\n(.*?)```", readme, flags=re.S)
    assert loop and "w.step(" in loop.group(1) and "if w.should_stop:" in loop.group(1)
    assert "pip install nnwatch" in readme and "pipx install nnwatch" in readme
    linked = re.findall(r"\]\(((?:docs|screenshots)/[^)#]+)", readme)
    assert linked and all((REPO / path).is_file() for path in linked), linked
    nav = (REPO / "mkdocs.yml").read_text()
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages == set(re.findall(r": (\S+\.md)$", nav, flags=re.M)), "a page missing from the nav"
    assert "| promise | checked by | measured |" in (REPO / "docs" / "reliability.md").read_text()
    assert "| kind | recall (3 seeds) |" in (REPO / "docs" / "detectors.md").read_text()


def test_make_test_runs_this_suite() -> None:
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^test: setup\n(\t.*\n)*\tbash scripts/test.sh", make, flags=re.M)
    script = (REPO / "scripts" / "test.sh").read_text()
    assert "pytest" in script and "-eq 5" in script  # "no tests collected" fails
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_make_demo_stands_for_the_exploding_demo(subprocess_env: dict[str, str]) -> None:
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^demo: setup\n\t\.venv/bin/nnwatch demo exploding$", make, flags=re.M)
    out = subprocess.run(
        [*NNWATCH, "demo", "exploding", "--headless"], cwd=REPO, env=subprocess_env,
        capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "exploding_gradients" in out.stdout


def test_monitor_commands_find_a_live_run(subprocess_env: dict[str, str]) -> None:
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tests.trainers.mlp_trainer", "--steps", "100000", "--delay", "0.01",
         "--name", "mnist-mlp"],
        cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert trainer.stdout is not None
        for line in trainer.stdout:
            if line.startswith("step 5"):
                break
        deadline = time.monotonic() + 30
        while True:
            ls = subprocess.run([*NNWATCH, "ls", "--json"], env=subprocess_env, capture_output=True,
                                text=True, timeout=60)
            assert ls.returncode == 0, ls.stderr
            runs = json.loads(ls.stdout)
            if any(r.get("name") == "mnist-mlp" for r in runs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        run = next(r for r in runs if r.get("name") == "mnist-mlp")
        assert "socket" in json.dumps(run)
        table = subprocess.run([*NNWATCH, "ls"], env=subprocess_env, capture_output=True, text=True,
                               timeout=60)
        assert "mnist-mlp" in table.stdout
        # `attach mnist-mlp` resolves the name the same way `ctl` does; the TUI itself is tested
        # in tests/tui/test_tui_live.py against a real trainer
        hello = subprocess.run([*NNWATCH, "ctl", "mnist-mlp", "hello"], env=subprocess_env,
                               capture_output=True, text=True, timeout=60)
        assert hello.returncode == 0, hello.stderr
        assert "mnist-mlp" in hello.stdout
    finally:
        trainer.kill()
        trainer.wait(timeout=10)


def test_snapshot_and_replay_commands(subprocess_env: dict[str, str]) -> None:
    demo = subprocess.run(
        [*NNWATCH, "demo", "nan_log", "--headless", "--keep"], cwd=REPO, env=subprocess_env,
        capture_output=True, text=True, timeout=240,
    )
    assert demo.returncode == 0, demo.stderr
    text = demo.stdout + demo.stderr
    assert "nan_or_inf" in text
    match = re.search(r"the run is kept in (\S+)", text)
    assert match, text
    run_dir = Path(match.group(1))
    assert any((run_dir / "snapshots").iterdir())
    replay = subprocess.run(
        [*NNWATCH, "replay", str(run_dir), "--model", "nnwatch.demos.nan_log:make", "--anomaly"],
        cwd=REPO, env=subprocess_env, capture_output=True, text=True, timeout=240,
    )
    assert replay.returncode == 0, replay.stderr
    assert "LogBackward0" in replay.stdout
    assert "nan_log.py:" in replay.stdout
    assert "bit for bit" in replay.stdout


def test_check_command(subprocess_env: dict[str, str]) -> None:
    out = subprocess.run(
        [*NNWATCH, "check", "tests.fixtures.check_factories:healthy"], cwd=REPO,
        env=subprocess_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[nnwatch check]" in out.stdout
    assert "checks: 5 passed, 0 failed" in out.stdout


@pytest.mark.parametrize("name", ["py.typed"])
def test_package_is_typed(name: str) -> None:
    assert (REPO / "nnwatch" / name).exists()
