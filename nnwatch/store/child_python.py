"""How nnwatch starts a Python process of its own: never importing from where it happens to be.

``python -m module`` puts the current directory first on ``sys.path``, ahead of site-packages. A
trainer started from a directory another user can write (``/shared``, ``/tmp``) would then run
their ``nnwatch/__init__.py`` (or ``numpy/``...) as its own user, root included, in each process
nnwatch starts for it: the detectors' process, the stream process that serves a monitor, a demo's
trainer and the browser view's per-tab monitors. So every such child is started

- with ``-P`` (Python 3.11+: no such entry at all) and in ``/`` as its working directory (on 3.10
  the entry ``-m`` adds is then ``/``, which only root can write; and a relative path it is
  given cannot resolve into someone else's directory);
- with this nnwatch's own directory first on ``PYTHONPATH`` (the parent may have found it
  through ``sys.path`` edits the child would not make: an editable or source checkout), then the
  parent's ``PYTHONPATH`` with every entry made absolute as the parent sees it; an empty entry
  (the current directory, usually the accident of ``PYTHONPATH=$PYTHONPATH:x``) is left out;
- with ``NNWATCH_RUN_DIR`` made absolute, so that the child finds the runs its parent means.

Not ``-I``: it also drops ``PYTHONPATH`` and the user's site-packages, where a ``pip install
--user nnwatch`` lives, and the child would not find nnwatch at all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

#: The working directory of every child: nothing in it is imported, and only root can write it.
CHILD_CWD = "/"
_RUN_DIR_ENV = "NNWATCH_RUN_DIR"


def isolation_flags() -> list[str]:
    """The interpreter flags that keep the current directory off a child's ``sys.path``."""
    return ["-P"] if sys.version_info >= (3, 11) else []


def python_argv(module: str, *args: str) -> list[str]:
    """``[python, -P, -m, module, *args]`` for this interpreter (run it with :func:`child_env`
    and ``cwd=CHILD_CWD``)."""
    return [sys.executable, *isolation_flags(), "-m", module, *args]


def package_root() -> str:
    """The directory this nnwatch package is imported from (site-packages, or a checkout)."""
    return str(Path(__file__).resolve().parents[2])


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) as a child of nnwatch gets it: this nnwatch
    first on ``PYTHONPATH``, every other entry absolute, no empty one; the run root absolute."""
    env = dict(os.environ if base is None else base)
    root = package_root()
    entries = [] if root in _site_dirs() else [root]  # a site directory is on the path anyway
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and os.path.abspath(entry) not in entries:
            entries.append(os.path.abspath(entry))
    env["PYTHONPATH"] = os.pathsep.join(entries)
    if env.get(_RUN_DIR_ENV):
        env[_RUN_DIR_ENV] = os.path.abspath(os.path.expanduser(env[_RUN_DIR_ENV]))
    return env


def shell_command(argv: list[str]) -> str:
    """A shell line that runs ``argv`` as a child of nnwatch should run (for a launcher that
    takes a command line, such as textual-serve): in ``/``, with :func:`child_env`'s path."""
    import shlex

    env = child_env()
    assign = [f"{k}={env[k]}" for k in ("PYTHONPATH", _RUN_DIR_ENV) if env.get(k)]
    return f"cd {CHILD_CWD} && exec {shlex.join(['env', *assign, *argv])}"


def _site_dirs() -> set[str]:
    """This interpreter's site-packages directories (where an installed nnwatch lives)."""
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {str(Path(d).resolve()) for d in dirs}
