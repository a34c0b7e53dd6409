"""One line of a rank's report, written in one call.

``print`` writes the text and its newline in two calls, so two ranks sharing torchrun's stdout can
splice their lines ("rank 1 run_dir Arank 0 run_dir B"), and a test then reads a directory that
does not exist. One ``os.write`` of a short line to a pipe is atomic (under PIPE_BUF bytes).
"""

from __future__ import annotations

import os
import sys


def say(text: str) -> None:
    """Write ``text`` and its newline to stdout as one write."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (text + "\n").encode())
