"""Issue 43: a fuzz over hostile run directories, registry entries and rings, every reader over
each (``tests/hostile_runs.py``): 0 hangs, 0 crashes by a signal, 0 tracebacks, 0 balloons.

Hypothesis draws, per case, a few files of a real run root to replace (meta, end, events, the
log's rows and checksums, the overview, the ring, registry entries, the copy and first-stop
notes) and what to put there: a FIFO, a link to ``/dev/zero`` or ``/dev/urandom`` or to a
directory, a directory, a hole extending the file to gigabytes, a cut, flipped bytes, JSON nested
100,000 deep, numbers past any bound. A batch of cases runs in a child process under a timeout
and a 3 GiB address-space limit; the child reports every exception a reader raised that is not
its own error with a message.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import hostile_runs
from tests.conftest import REPO

PYTHON = sys.executable
pytestmark = [pytest.mark.timeout(1800), pytest.mark.slow]
#: Seconds a batch of cases may take: generous for a loaded 2-core machine, far below a hang.
BATCH_TIMEOUT = 600

case_st = st.lists(
    st.tuples(st.sampled_from(hostile_runs.FILES), st.sampled_from(hostile_runs.KINDS),
              st.integers(0, 2**16)),  # fmt: skip
    min_size=1, max_size=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hostile_runs.make_base(tmp_path_factory.mktemp("hostile") / "root")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(batch=st.lists(case_st, min_size=6, max_size=6))
def test_no_reader_hangs_crashes_or_balloons_on_hostile_runs(base: Path, batch: list) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="nnw-hostile-"))
    try:
        roots = []
        for i, ops in enumerate(batch):
            root = scratch / f"case{i}"
            shutil.copytree(base, root, symlinks=True)
            for rel, kind, seed in ops:
                hostile_runs.plant(root, rel, kind, seed)
            roots.append(str(root))
        try:
            done = subprocess.run(
                [PYTHON, "-m", "tests.hostile_runs", *roots], cwd=REPO, capture_output=True,
                text=True, timeout=BATCH_TIMEOUT, preexec_fn=_limited,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            last = out.strip().splitlines()[-1:] or ["(nothing)"]
            pytest.fail(f"a reader hung: the last call was {last[0]}; cases: {batch}")
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:], batch)  # no signal
        last = json.loads(done.stdout.strip().splitlines()[-1])
        assert last["failures"] == [], "\n\n".join(last["failures"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
