"""``nnwatch serve`` in a real headless Chromium (Playwright): the dashboard of a real recorded run
renders in the page, a key press reaches the app, and a wrong token is refused.

Skipped, with the reason, where Playwright or a Chromium binary is missing (Debian's ``chromium``
package, or ``playwright install chromium``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures import snapshot_runs

pytestmark = pytest.mark.timeout(120)

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs playwright (pip install playwright)"
)
pytest.importorskip("textual_serve", reason="needs textual-serve (pip install textual-serve)")


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> object:
    root = tmp_path_factory.mktemp("serve")
    env = dict(os.environ, NNWATCH_RUN_DIR=str(root))
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        run_dir = snapshot_runs.table_run(root / "table").parent.parent
    finally:
        mp.undo()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nnwatch", "serve", str(run_dir)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"nnwatch serve exited with {proc.returncode}")
            m = re.search(r"open (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            url = m.group(1) if m else None
        assert url, "nnwatch serve printed no URL"
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def screen_text(page: object) -> str:
    return page.evaluate("() => document.body.innerText")  # type: ignore[attr-defined]


class Frames:
    """What the app sent to the page over its websocket (xterm.js draws it on a canvas, so the
    DOM holds no text): the terminal output, as text, for ``wait_for``."""

    def __init__(self, page: object) -> None:
        self.chunks: list[str] = []
        page.on("websocket", self._attach)  # type: ignore[attr-defined]

    def _attach(self, ws: object) -> None:
        ws.on("framereceived", self._frame)  # type: ignore[attr-defined]

    def _frame(self, payload: object) -> None:
        data = payload if isinstance(payload, (bytes, bytearray)) else str(payload).encode()
        self.chunks.append(bytes(data).decode("utf-8", errors="ignore"))

    def wait_for(self, page: object, text: str, timeout: float = 60.0, start: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in "".join(self.chunks[start:]):
                return
            page.wait_for_timeout(200)  # type: ignore[attr-defined]
        raise AssertionError(f"{text!r} never reached the browser")


def test_dashboard_renders_and_keys_work_in_chromium(served: str) -> None:
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium binary (apt-get install chromium, or playwright install chromium)")
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        except Exception as exc:  # noqa: BLE001 - a broken browser install: say why and skip
            pytest.skip(f"Chromium does not start here: {exc}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            frames = Frames(page)
            response = page.goto(served)
            assert response is not None and response.status == 200
            frames.wait_for(page, "Grad norm")  # the dashboard, drawn in the page
            frames.wait_for(page, "table-mlp")
            assert "Events:" not in "".join(frames.chunks)
            page.wait_for_timeout(1000)
            page.locator("body").click()
            mark = len(frames.chunks)
            page.keyboard.press("e")  # a key typed in the browser opens the events screen
            frames.wait_for(page, "Events:", timeout=30, start=mark)

            wrong = re.sub(r"token=\S+", "token=not-the-token", served)
            fresh = browser.new_context().new_page()
            response = fresh.goto(wrong)
            assert response is not None and response.status == 403
            assert "wrong or missing token" in screen_text(fresh)
            response = fresh.goto(served.split("?")[0])  # no token at all
            assert response is not None and response.status == 403
        finally:
            browser.close()


# -- issue 43: no token in argv, nothing from the internet, nothing from the cwd ---------------


def _cmdlines() -> list[str]:
    """Every process's command line on this machine, as ``ps`` shows them to any user."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return out


def test_served_from_a_hostile_cwd_with_a_private_token(tmp_path: Path) -> None:
    """``nnwatch serve`` started from a directory holding a planted ``nnwatch`` package, with its
    token from stdin: the tab's monitor runs (the dashboard renders) and imports nothing planted,
    no process shows the token in its command line, and every request the page makes goes to the
    server itself (before: the page asked fonts.googleapis.com for Roboto Mono)."""
    exe = chromium_path()
    if exe is None:
        pytest.skip("no Chromium binary (apt-get install chromium, or playwright install chromium)")
    root = tmp_path / "root"
    mp = pytest.MonkeyPatch()
    mp.setenv("NNWATCH_RUN_DIR", str(root))
    try:
        run_dir = snapshot_runs.table_run(root / "table").parent.parent
    finally:
        mp.undo()
    hostile = tmp_path / "hostile"
    (hostile / "nnwatch").mkdir(parents=True)
    (hostile / "nnwatch" / "__init__.py").write_text(
        f"open({str(hostile / 'PWNED')!r}, 'w').close()\n"
    )
    token = "tok-" + os.urandom(8).hex()
    script = Path(sys.executable).parent / "nnwatch"  # the console script: not run from the cwd
    proc = subprocess.Popen(
        [str(script), "serve", str(run_dir), "--token-file", "-"], cwd=hostile,
        env=dict(os.environ, NNWATCH_RUN_DIR=str(root)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(token + "\n")
        proc.stdin.close()
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line, f"nnwatch serve exited with {proc.wait()}"
            m = re.search(r"open (http://127\.0\.0\.1:\d+/\?token=\S+)", line)
            url = m.group(1) if m else None
        assert url.endswith("token=" + token)
        origin = url.split("/?")[0]
        with sync_api.sync_playwright() as p:
            try:
                browser = p.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
            except Exception as exc:  # noqa: BLE001 - a broken browser install: say why and skip
                pytest.skip(f"Chromium does not start here: {exc}")
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 800})
                asked: list[str] = []
                page.on("request", lambda r: asked.append(r.url))
                frames = Frames(page)
                response = page.goto(url)
                assert response is not None and response.status == 200
                assert "127.0.0.1" in (response.headers.get("content-security-policy") or "")
                frames.wait_for(page, "Grad norm")  # the tab's monitor process runs
                elsewhere = [u for u in asked if not u.startswith((origin, origin.replace("http", "ws", 1)))]
                assert elsewhere == [], elsewhere
                assert "googleapis" not in page.content()
                shown = [c for c in _cmdlines() if token in c]
                assert shown == [], shown
            finally:
                browser.close()
        assert not (hostile / "PWNED").exists()
    finally:
        try:
            os.killpg(proc.pid, 15)  # serve and every tab's monitor
        except ProcessLookupError:
            pass
        proc.wait(10)


def test_a_token_on_the_command_line_is_refused_in_words() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nnwatch", "serve", "whatever", "--token", "secret"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.returncode != 0
    assert "ps" in done.stderr and "--token-file" in done.stderr, done.stderr
