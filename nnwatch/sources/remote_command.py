"""The command line that runs ``nnwatch WORDS...`` on another host, with nothing configured there.

A non-interactive ssh rarely has the training venv on its PATH, but every run's registry entry
(and its ``meta.json``) names the Python that runs it, and that Python has nnwatch. So, unless the
user named a command (``--remote-nnwatch`` or the config file), ssh runs a plain POSIX ``sh``
step that reads those ``executable`` fields, newest run first, and runs ``PYTHON -m nnwatch``
with the first one that imports nnwatch; then ``nnwatch`` on the PATH, then ``python3 -m
nnwatch``; else it exits 127 with a line :func:`explain_failure` turns into what to install.

The step is one line, in single quotes, without ``!``, ``'`` or newlines, so that the user's
login shell (sh, bash, zsh, fish or csh) hands it to ``sh`` unchanged.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

#: What the step prints (on stderr, exit status 127) when it finds no nnwatch on the host.
NOT_FOUND = "nnwatch-remote: no nnwatch here"

#: $1 is the run root ("" for the default, as nnwatch computes it), the rest nnwatch's words.
_FIND_PYTHON = "; ".join(
    [
        "r=$1",
        "shift",
        'if [ -z "$r" ]; then r=${NNWATCH_RUN_DIR:-}; fi',
        'if [ -z "$r" ]; then if [ -d /dev/shm ] && [ -w /dev/shm ]; then '
        "r=/dev/shm/nnwatch-$(id -u); else r=${TMPDIR:-/tmp}/nnwatch-$(id -u); fi; fi",
        "t=:",
        'p=$(ls -t "$r"/registry/*.json "$r"/runs/*/meta.json "$r"/*/meta.json 2>/dev/null'
        " | while IFS= read -r f; do"
        ' x=$(sed -n "s/.*\\"executable\\": *\\"//p" "$f" | sed "s/\\".*//" | head -n 1);'
        ' case "$t" in *":$x:"*) continue;; esac; t="$t$x:";'
        ' if [ -n "$x" ] && [ -x "$x" ] && "$x" -c "import nnwatch" >/dev/null 2>&1;'
        ' then echo "$x"; break; fi; done)',
        'if [ -n "$p" ]; then exec "$p" -m nnwatch "$@"; fi',
        'if command -v nnwatch >/dev/null 2>&1; then exec nnwatch "$@"; fi',
        "for x in python3 python; do"
        ' if command -v "$x" >/dev/null 2>&1 && "$x" -c "import nnwatch" >/dev/null 2>&1;'
        ' then exec "$x" -m nnwatch "$@"; fi; done',
        f'echo "{NOT_FOUND}: no run under $r names a Python that has it, and neither nnwatch nor'
        ' python3 -m nnwatch runs from the PATH of this ssh session" >&2',
        "exit 127",
    ]
)


def remote_command(
    words: Sequence[str], *, remote_nnwatch: str | None = None, root: str | None = None
) -> str:
    """What ssh runs on the far host for ``nnwatch WORDS...``: the user's command when one is
    named (``--remote-nnwatch``, the config file), else the step that finds the runs' Python.
    ``root`` is the run root there (``--root``), when it is not the default."""
    words = [*words, *(["--root", root] if root else [])]
    quoted = " ".join(shlex.quote(w) for w in words)
    if remote_nnwatch:
        return f"{remote_nnwatch} {quoted}"
    assert "'" not in _FIND_PYTHON and "!" not in _FIND_PYTHON
    return f"sh -c '{_FIND_PYTHON}' nnwatch {shlex.quote(root or '')} {quoted}"


def explain_failure(host: str, returncode: int, stderr: str, remote_nnwatch: str | None) -> str:
    """A failed remote nnwatch in plain words: ssh's or nnwatch's own last line, and when
    nnwatch is missing there, how to get it there or name it."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    why = lines[-1] if lines else f"exit status {returncode}"
    if NOT_FOUND in stderr or (returncode == 127 and remote_nnwatch is None):
        return (
            f"nnwatch is not installed on {host} where this ssh can find it (no run there names "
            "a Python with nnwatch, and none is on the PATH of a non-interactive ssh). Install "
            "it in the training environment there (pip install nnwatch), or name the command: "
            "--remote-nnwatch '~/venv/bin/python -m nnwatch', or remote_nnwatch in "
            "~/.config/nnwatch/config.toml"
        )
    if returncode == 127 or "not found" in why:
        return (
            f"{why}; `{remote_nnwatch}` does not run on {host}: --remote-nnwatch (or "
            "remote_nnwatch in ~/.config/nnwatch/config.toml) names the command that runs "
            "nnwatch there"
        )
    return why
