"""``python -m nnwatch`` is the same as the ``nnwatch`` command."""

from __future__ import annotations

from nnwatch.cli import main

raise SystemExit(main())
