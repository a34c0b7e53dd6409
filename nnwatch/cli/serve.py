"""``nnwatch serve RUN``: the same monitor in a browser, through textual-serve, on 127.0.0.1 only.

For a colleague on the same machine, or a laptop with ``ssh -L PORT:127.0.0.1:PORT gpu-host``,
who would rather click a link than open a terminal. Each browser tab runs its own monitor process
(``nnwatch open`` for a run on disk, ``nnwatch attach`` for a live one), exactly the app the
terminal shows. It listens on the loopback interface only, and every page and websocket needs the
random token printed in the URL: other users of a shared machine can reach 127.0.0.1 too. The
first page sets the token as a same-site cookie for the websocket that follows; a wrong or missing
token gets 403. A token of one's own comes from ``$NNWATCH_SERVE_TOKEN`` or ``--token-file``,
never from the command line, where every user of the machine reads it in ``ps``.

The page asks nothing of the internet: textual-serve's template loads its font from Google, which
on a machine without a network stalls the page and elsewhere tells a third party who opened it.
The font is served from textual-serve's own copy instead, and a Content-Security-Policy header
makes the browser refuse anything but this server.
"""

from __future__ import annotations

import argparse
import hmac
import os
import re
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

from nnwatch.store.child_python import python_argv, shell_command

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
        "--token-file",
        metavar="FILE",
        default=None,
        help="read the URL token from FILE (- for stdin) instead of making a fresh random one; "
        "$NNWATCH_SERVE_TOKEN also sets it (never on the command line: `ps` shows it to everyone)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="refused: a token on the command line is shown to every user by `ps` (use "
        "--token-file or $NNWATCH_SERVE_TOKEN)",
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
        return python_argv("nnwatch", "attach", spec)  # never importing from the cwd (see there)
    run_dir = resolve_run_dir(spec)
    if run_dir is None:
        return None
    return python_argv("nnwatch", "open", str(run_dir.resolve()))


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
                    asset: web.StreamResponse = offline(await handler(request), port)
                    return asset  # the page's JS, CSS, font
                given = request.query.get("token") or request.cookies.get(COOKIE) or ""
                if not hmac.compare_digest(given.encode(), token.encode()):
                    return web.Response(
                        status=403,
                        text="nnwatch serve: wrong or missing token; use the URL that "
                        "`nnwatch serve` printed\n",
                    )
                response: web.StreamResponse = offline(await handler(request), port)
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

    return TokenServer(shell_command(command), host=HOST, port=port, title=title)


#: Where the page may load from and connect to: this server only.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; "
    "connect-src 'self' ws://127.0.0.1:{port} ws://localhost:{port}"
)
#: textual-serve's template asks Google for its font; this serves the copy it ships instead.
_FONT_FACE = (
    '<style>@font-face {{ font-family: "Roboto Mono"; '
    'src: url("/static/fonts/{name}") format("truetype"); }}</style>'
)
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?(?:https?:)?//[^>]*>", re.I | re.S)


def offline(response: Any, port: int) -> Any:
    """``response`` made to ask nothing of the internet: remote ``<link>`` elements dropped from
    a page (with the font served locally), and a policy that refuses anything but this server."""
    if getattr(response, "prepared", False):
        return response  # a websocket, already answered: nothing to change
    response.headers["Content-Security-Policy"] = _CSP.format(port=port)
    body = getattr(response, "text", None) if response.content_type == "text/html" else None
    if isinstance(body, str) and _REMOTE_LINK.search(body):
        font = _local_font()
        face = _FONT_FACE.format(name=font) if font else ""
        response.text = _REMOTE_LINK.sub("", body).replace("</head>", face + "</head>", 1)
    return response


def _local_font() -> str | None:
    """The name of the Roboto Mono file textual-serve ships in its static folder, if any."""
    import textual_serve

    fonts = Path(textual_serve.__file__).parent / "static" / "fonts"
    found = sorted(p.name for p in fonts.glob("RobotoMono-*.ttf") if "Italic" not in p.name)
    return found[0] if found else None


def read_token(args: argparse.Namespace) -> str | None:
    """The token: from ``--token-file`` (``-``: stdin), else ``$NNWATCH_SERVE_TOKEN`` (taken out of
    the environment, so that no tab's process carries it), else a fresh random one; None, with a
    message, when the one given cannot be used."""
    if args.token is not None:
        print(
            "nnwatch serve: --token puts the token on the command line, where every user of this "
            "machine reads it (`ps`); pass it in $NNWATCH_SERVE_TOKEN or with --token-file FILE "
            "(- reads it from stdin)",
            file=sys.stderr,
        )
        return None
    env = os.environ.pop("NNWATCH_SERVE_TOKEN", None)
    if args.token_file is None:
        return env or secrets.token_urlsafe(24)
    try:
        if args.token_file == "-":
            text = sys.stdin.readline()
        else:
            from nnwatch.store.safe_read import read_small_file

            text = read_small_file(Path(args.token_file).expanduser(), limit=4096).decode()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"nnwatch serve: cannot read the token from {args.token_file}: {exc}", file=sys.stderr)
        return None
    token = text.strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        print("nnwatch serve: the token file must hold one word of printable characters", file=sys.stderr)
        return None
    return token


def run(args: argparse.Namespace) -> int:
    try:
        import textual_serve  # noqa: F401
    except ImportError:
        print(
            "nnwatch serve: needs the textual-serve package (pip install textual-serve)",
            file=sys.stderr,
        )
        return 1
    token = read_token(args)
    if token is None:
        return 2
    command = monitor_command(args.run)
    if command is None:
        print(
            f"nnwatch serve: {args.run} is neither a live run, a run directory nor a run name; "
            "`nnwatch ls --all` lists them",
            file=sys.stderr,
        )
        return 1
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
