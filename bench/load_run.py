"""How long ``nnwatch.load_run`` takes on a 10-million-step run of scalars (target: under 3 s).

The run is written the way the probe writes it (a meta.json and fixed-size binary rows), with
realistic values, then loaded cold in a fresh process and touched: a full pass over the loss and
grad-norm columns, as a viewer does when it decimates the history.

    python bench/load_run.py [--steps 10000000] [--dir /dev/shm/...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nnwatch.store.runlog import HEADER_SIZE, KIND_LAYERS, KIND_SCALARS, _header
from nnwatch.store.schema import RunMeta, RunSchema


def write_run(run_dir: Path, steps: int) -> None:
    schema = RunSchema(("fc1", "relu1", "fc2"), ("Linear", "ReLU", "Linear"), ("fc1", "fc2"), 1)
    meta = RunMeta(name="bench-10m", schema=schema, pid=1, host="bench", started=0.0)
    (run_dir / "meta.json").write_text(meta.to_json())
    (run_dir / "end.json").write_text('{"status": "finished"}')
    dtype = schema.scalar_dtype()
    chunk = 1_000_000
    rng = np.random.default_rng(0)
    with open(run_dir / "scalars.bin", "wb") as fh:
        fh.write(_header(dtype.itemsize, KIND_SCALARS))
        for start in range(0, steps, chunk):
            n = min(chunk, steps - start)
            rows = np.full(n, np.nan, dtype=dtype)
            rows["step"] = np.arange(start, start + n)
            rows["time"] = rows["step"] * 0.01
            rows["loss"] = 2.3 * np.exp(-rows["step"] / steps) + rng.normal(0, 0.05, n)
            rows["grad_norm"] = np.abs(rng.normal(1.0, 0.2, n))
            rows["lr"] = 1e-3
            fh.write(rows.tobytes())
    with open(run_dir / "layers.bin", "wb") as fh:
        fh.write(_header(schema.layer_row_dtype().itemsize, KIND_LAYERS))
    assert (run_dir / "scalars.bin").stat().st_size == HEADER_SIZE + steps * dtype.itemsize


LOAD = """
import sys, time
t0 = time.perf_counter()
import nnwatch
t1 = time.perf_counter()
run = nnwatch.load_run(sys.argv[1])
t2 = time.perf_counter()
loss = run["loss"]; g = run["grad_norm"]
cols = 2000
n = len(loss) // cols * cols
lo = loss[:n].reshape(cols, -1).min(axis=1); hi = g[:n].reshape(cols, -1).max(axis=1)
t3 = time.perf_counter()
print(f"{len(run)} {t1 - t0:.3f} {t2 - t1:.3f} {t3 - t2:.3f}")
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10_000_000)
    ap.add_argument("--dir", default=None, help="where to write the run (default: a temp dir)")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="nnw-load-"))
    run_dir = base / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    write_run(run_dir, args.steps)
    size = (run_dir / "scalars.bin").stat().st_size
    print(f"wrote {args.steps:,} steps ({size / 1e9:.2f} GB) in {time.perf_counter() - t:.1f} s")
    try:
        # page cache dropped where we may (root), so the first load is cold
        if os.geteuid() == 0:
            subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=False,
                           stderr=subprocess.DEVNULL)
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", LOAD, str(run_dir)], capture_output=True,
                                 text=True, check=True).stdout.split()
            n, imp, load, scan = int(out[0]), *map(float, out[1:])
            print(f"{label}: load_run {load:.3f} s + full decimating pass over 2 columns {scan:.3f} s "
                  f"= {load + scan:.3f} s for {n:,} steps (import nnwatch {imp:.2f} s; target < 3 s)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
