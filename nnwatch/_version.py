"""The package version, kept in one place so the registry and the CLI agree."""

from __future__ import annotations

__version__ = "0.1.0"
