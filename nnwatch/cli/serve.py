"""``nnwatch serve RUN``: the same monitor in a browser, through textual-serve, on 127.0.0.1 only.

For a colleague on the same machine, or a laptop with ``ssh -L PORT:127.0.0.1:PORT gpu-host``,
who would rather click a link than open a terminal. Each browser tab runs its own monitor process
(``nnwatch open`` for a run on disk, ``nnwatch attach`` for a live one), exactly the app the
terminal shows. It listens on the loopback interface only, and every page and websocket needs the
random token printed in the URL: other users of a shared machine can reach 127.0.0.1 too. The
first page sets the token as a same-site cookie for the websocket that follows; a wrong or missing
token gets 403.
"""

from __future__ import annotations

import argparse
import hmac
import os
import secrets
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

COMMAND = "serve"
HELP = "serve the monitor of a run to a browser (textual-serve, 127.0.0.1, a token in the URL)"
HOST = "127.0.0.1"
COOKIE = "nnwatch_token"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", metavar="RUN", help="a run directory, or a run name from `nnwatch ls`"
    )
    from nnwatch.cli._options import add_root_argument

    add_root_argument(parser)
    parser.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--token",
        default=None,
        help="the URL token (default: a fresh random one; $NNWATCH_SERVE_TOKEN also sets it)",
    )


def monitor_command(spec: str) -> list[str] | None:
    """The command each browser tab runs: ``attach`` for a live run, ``open`` for one on disk."""
    from nnwatch.cli.open import resolve_run_dir

    try:
        from nnwatch.store.registry import list_runs

        live = [r for r in list_runs() if spec in (r.name, Path(r.run_dir).name, r.run_dir)]
    except OSError:
        live = []
    if live and not Path(spec).is_dir():
        return [sys.executable, "-m", "nnwatch", "attach", spec]
    run_dir = resolve_run_dir(spec)
    if run_dir is None:
        return None
    return [sys.executable, "-m", "nnwatch", "open", str(run_dir.resolve())]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def make_server(command: list[str], port: int, token: str, title: str) -> Any:
    """A textual-serve Server that refuses any request without the token."""
    from aiohttp import web
    from textual_serve.server import Server

    class TokenServer(Server):
        async def _make_app(self) -> web.Application:
            app = await super()._make_app()

            @web.middleware
            async def require_token(request: web.Request, handler: Any) -> web.StreamResponse:
                if request.path.startswith("/static/"):
                    return await handler(request)  # the page's own JS and CSS: nothing secret
                given = request.query.get("token") or request.cookies.get(COOKIE) or ""
                if not hmac.compare_digest(given.encode(), token.encode()):
                    return web.Response(
                        status=403,
                        text="nnwatch serve: wrong or missing token; use the URL that "
                        "`nnwatch serve` printed\n",
                    )
                response = await handler(request)
                if request.path == "/" and request.query.get("token"):
                    response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
                return response

            app.middlewares.append(require_token)
            return app

        async def on_startup(self, app: web.Application) -> None:
            print(f"nnwatch serve: open {self.public_url}/?token={token}", flush=True)
            print(
                "  (127.0.0.1 only; from another machine: ssh -L "
                f"{self.port}:127.0.0.1:{self.port} THIS_HOST). Ctrl+C stops it.",
                flush=True,
            )

    return TokenServer(shlex.join(command), host=HOST, port=port, title=title)


def run(args: argparse.Namespace) -> int:
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        print(
            "nnwatch serve: needs the textual-serve package (pip install textual-serve)",
            file=sys.stderr,
        )
        return 1
    command = monitor_command(args.run)
    if command is None:
        print(
            f"nnwatch serve: {args.run} is neither a live run, a run directory nor a run name; "
            "`nnwatch ls --all` lists them",
            file=sys.stderr,
        )
        return 1
    token = args.token or os.environ.get("NNWATCH_SERVE_TOKEN") or secrets.token_urlsafe(24)
    port = args.port or free_port()
    os.environ["NNWATCH_FORCE_TUI"] = "1"  # each tab's monitor talks to the browser, not a tty
    server = make_server(command, port, token, f"nnwatch · {Path(args.run).name}")
    try:
        server.serve()
    except OSError as exc:
        print(
            f"nnwatch serve: cannot listen on {HOST}:{port}: {exc.strerror or exc}", file=sys.stderr
        )
        return 1
    return 0
