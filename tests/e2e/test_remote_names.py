"""The smaller things seen over ssh (issue 42, item 5), through a real sshd on 127.0.0.1:

- the remote picker's findings column counts a run's findings, as the local one does (it showed
  "–": the count was looked for in a local file that does not exist);
- the remote dashboard's header names the host as the user named it to ssh, not its hostname;
- ``nnwatch ls HOST`` lists the runs there (it was a bare argparse error), under that name.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

from nnwatch.sources.remote import RemoteRun, RemoteSource, remote_runs
from nnwatch.store.findings_count import findings_count
from nnwatch.testing.tui import fixed_hardware, wait_until
from nnwatch.tui.app import NNWatchApp
from nnwatch.tui.picker import RunPickerApp
from nnwatch.tui.widgets.header import RunHeader
from tests.e2e.test_remote_ssh import remote  # noqa: F401 - fixture
from tests.e2e.test_ssh_forward import pytestmark, tunnel  # noqa: F401 - fixture, skip mark
from tests.integration.test_channel_faults import Trainer, wait_for

REPO = Path(__file__).resolve().parents[2]


def _run_with_findings(env: dict[str, str]) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "nnwatch", "demo", "nan_log", "--headless", "--steps", "60", "--keep"],
        env=env, capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kept = re.search(r"the run is kept in (\S+)", done.stderr)
    assert kept, done.stderr
    return Path(kept.group(1))


def test_the_remote_picker_counts_findings_as_the_local_one_does(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    host = f"{getpass.getuser()}@127.0.0.1"
    run_dir = _run_with_findings(subprocess_env)
    here = findings_count(run_dir)
    assert here, "the demo found nothing"

    def lister() -> list[RemoteRun]:
        return [RemoteRun.from_row(r, host) for r in remote_runs(host, finished=True, **remote)]  # type: ignore[arg-type]

    app = RunPickerApp(lister=lister, refresh_s=60.0, title=f"runs on {host}")

    async def main() -> dict[str, int | None]:
        async with app.run_test(size=(180, 30)) as pilot:
            await wait_until(pilot, lambda: bool(app.findings), timeout=60)
            return dict(app.findings)

    shown = asyncio.run(main())
    assert shown == {str(run_dir): here}, shown


def test_the_remote_header_and_ls_name_the_host_as_the_user_did(
    remote: dict[str, object],  # noqa: F811
    subprocess_env: dict[str, str],
) -> None:
    host = f"{getpass.getuser()}@127.0.0.1"
    trainer = Trainer(subprocess_env, "--steps", "0", "--rate", "50", "--name", "named-host")
    try:
        wait_for(lambda: trainer.published() > 5, timeout=60)
        source = RemoteSource(host, "named-host", **remote)  # type: ignore[arg-type]
        app = NNWatchApp(source, hardware=fixed_hardware, fps=10)

        async def main() -> str:
            async with app.run_test(size=(160, 40)) as pilot:
                await wait_until(pilot, lambda: app.state.history.last_step > 3, timeout=60)
                app.refresh_panes()
                await pilot.pause(0.3)
                return str(app.query_one(RunHeader)._picture.plain)

        try:
            head = asyncio.run(main())
        finally:
            source.close()
        assert f"{host}:{trainer.pid}" in head, head
        assert f"{socket.gethostname()}:{trainer.pid}" not in head, head

        ssh = [f"--ssh-arg={x}" for x in remote["ssh_args"]]  # type: ignore[attr-defined]
        words = [*ssh, "--remote-nnwatch", str(remote["remote_nnwatch"])]
        env = {**subprocess_env, "PYTHONPATH": str(REPO)}
        listed = subprocess.run([sys.executable, "-m", "nnwatch", "ls", host, *words], env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        line = next(ln for ln in listed.stdout.splitlines() if "named-host" in ln)
        assert host in line.split() and str(trainer.pid) in line.split(), listed.stdout
        as_json = subprocess.run([sys.executable, "-m", "nnwatch", "ls", host, "--json", *words],
                                 env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        rows = json.loads(as_json.stdout)
        assert [r["host"] for r in rows if r["name"] == "named-host"] == [host], rows
        bad = subprocess.run([sys.executable, "-m", "nnwatch", "ls", "no-such-host.invalid",
                              *shlex.split("--ssh-arg=-oBatchMode=yes")], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert bad.returncode == 1 and "no-such-host.invalid" in bad.stderr, bad.stderr
        assert "usage:" not in bad.stderr, bad.stderr
    finally:
        trainer.kill()
