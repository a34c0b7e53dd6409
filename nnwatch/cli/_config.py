"""The user's config file: per-host defaults for reaching runs on other machines.

``~/.config/nnwatch/config.toml`` (``$XDG_CONFIG_HOME``, or ``$NNWATCH_CONFIG`` names the file),
read with the standard library. Nothing in it is needed: without it, nnwatch reaches a host with
plain ``ssh HOST`` and finds nnwatch there through the runs' own Python. It is for the odd host::

    [remote]                      # every host
    ssh_args = ["-o", "ConnectTimeout=10"]

    [hosts.gpu-host]              # the name as you type it (`nnwatch gpu-host`)
    remote_nnwatch = "~/venv/bin/python -m nnwatch"
    ssh_args = ["-p", "2222"]
    root = "/scratch/me/nnwatch"  # the run root there, when it is not the default

A flag on the command line wins over the host's table, which wins over ``[remote]``; ssh
arguments add up (``[remote]``, then the host's, then ``--ssh-arg``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 reads TOML with tomli, the same parser
    import tomli as tomllib

ENV_CONFIG = "NNWATCH_CONFIG"
#: Each key a host table may hold, and the type of its value.
KEYS: dict[str, type] = {"remote_nnwatch": str, "ssh": str, "ssh_args": list, "root": str}


class ConfigError(ValueError):
    """The config file cannot be read or holds something nnwatch does not know; says where."""


@dataclass(frozen=True)
class HostSettings:
    """How to reach one host: what the config says for it, merged over ``[remote]``."""

    ssh: str | None = None
    ssh_args: tuple[str, ...] = ()
    remote_nnwatch: str | None = None
    root: str | None = None
    #: Where these came from, for messages ("" without a config file).
    source: str = field(default="", compare=False)


def config_path() -> Path:
    """``$NNWATCH_CONFIG``, else ``$XDG_CONFIG_HOME/nnwatch/config.toml`` (``~/.config``)."""
    named = os.environ.get(ENV_CONFIG)
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "nnwatch" / "config.toml"


def _table(doc: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in doc.items():
        want = KEYS.get(key)
        if want is None:
            known = ", ".join(KEYS)
            raise ConfigError(f"{where}: unknown key {key!r} (known: {known})")
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not isinstance(value, want) or (want is list and not strings):
            kind = "a list of strings" if want is list else "a string"
            raise ConfigError(f"{where}: {key} must be {kind}, not {value!r}")
    return doc


def load(path: Path | None = None) -> dict[str, Any]:
    """The parsed file (``{}`` when there is none); ConfigError with the place of a mistake."""
    path = config_path() if path is None else path
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"remote", "hosts"})
    if unknown:
        raise ConfigError(f"{path}: unknown table {unknown[0]!r} (known: remote, hosts)")
    _table(doc.get("remote", {}), f"{path} [remote]")
    for host, table in doc.get("hosts", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: hosts.{host} must be a table ([hosts.{host}])")
        _table(table, f"{path} [hosts.{host}]")
    return dict(doc)


def host_settings(host: str, path: Path | None = None) -> HostSettings:
    """What the config says for ``host`` as the user typed it; ``user@host`` also finds the
    table of ``host``."""
    path = config_path() if path is None else path
    doc = load(path)
    if not doc:
        return HostSettings()
    hosts = doc.get("hosts", {})
    mine = hosts.get(host) or hosts.get(host.rpartition("@")[2]) or {}
    every = doc.get("remote", {})
    merged = {**every, **mine}
    return HostSettings(
        ssh=merged.get("ssh"),
        ssh_args=(*every.get("ssh_args", ()), *mine.get("ssh_args", ())),
        remote_nnwatch=merged.get("remote_nnwatch"),
        root=merged.get("root"),
        source=str(path),
    )


def ssh_options(
    host: str,
    *,
    ssh: str | None = None,
    ssh_args: Sequence[str] = (),
    remote_nnwatch: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``RemoteSource``, ``remote_runs`` and ``PullRequest`` for
    ``host``: the command line's flags over the config file's, over the built-in defaults."""
    conf = host_settings(host)
    return {
        "ssh": ssh or conf.ssh or "ssh",
        "ssh_args": [*conf.ssh_args, *ssh_args],
        "remote_nnwatch": remote_nnwatch or conf.remote_nnwatch,
        "remote_root": conf.root,
    }


def ssh_flags(args: Any) -> dict[str, Any]:
    """What the command line says about reaching other hosts (None where it says nothing)."""
    return {"ssh": args.ssh, "ssh_args": list(args.ssh_args), "remote_nnwatch": args.remote_nnwatch}


def ssh_options_for(args: Any, host: str) -> dict[str, Any]:
    """The keyword arguments of ``RemoteSource``, ``remote_runs`` and ``PullRequest`` for
    ``host``: the command line's flags over the config file's table for it."""
    return ssh_options(host, **ssh_flags(args))
