"""nnwatch on training programs written the way public projects write them.

Each program in ``tests/corpus/`` imitates a well-known script (nanoGPT's train.py, the PyTorch
examples, a Hugging Face style loop, ...) and is watched with only the README's lines added:
``import nnwatch``, ``with nnwatch.watch(...) as w:`` and ``w.step(loss)``. Test plumbing in each
program (``tests/corpus/_record.py``) writes what the program's own code computed, such as the
norm that its ``clip_grad_norm_`` call returned, and these tests compare that with what nnwatch
recorded. They check the promises of DESIGN.md's probe section: the pre-clip norm is taken from
whatever already computed it (torch's clip) or from the accumulated gradients when backward ends,
and hooks never end up in the user's saved objects.

All eleven programs run once per session, in parallel, as real subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nnwatch
from nnwatch.store.run_reader import Run

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "corpus"
TIMEOUT = 240.0  # seconds for the whole corpus; about 25 s on a 2-core machine


@dataclass(frozen=True)
class Program:
    """One corpus program and what the tests expect of it."""

    args: tuple[str, ...] = ()
    #: how the program clips: torch (clip_grad_norm_), manual, value (clip_grad_value_), none
    clip: str = "torch"
    #: whole models saved with torch.save(model, ...), relative to the working directory
    whole_models: tuple[str, ...] = ()
    #: state_dicts saved with torch.save(model.state_dict(), ...)
    state_dicts: tuple[str, ...] = ()
    crashes: bool = False


PROGRAMS: dict[str, Program] = {
    "gpt_accum": Program(whole_models=("out/ckpt.pt",)),
    "rnn_lm": Program(whole_models=("model.pt",)),
    "mnist_cnn": Program(args=("--save-model",), clip="none", state_dicts=("mnist_cnn.pt",)),
    "vae": Program(clip="value"),
    "dcgan": Program(state_dicts=("netG_epoch_1.pth", "netD_epoch_1.pth")),
    "hf_style": Program(),
    "manual_rescale": Program(clip="manual"),
    "diverging": Program(),
    "crash": Program(clip="none", crashes=True),
    "amp_timm": Program(),
    "accelerate_glue": Program(),
}
TORCH_CLIP = [n for n, p in PROGRAMS.items() if p.clip == "torch"]
MEASURED = [n for n, p in PROGRAMS.items() if p.clip in ("manual", "value", "none") and not p.crashes]
SAVES = [n for n, p in PROGRAMS.items() if p.whole_models or p.state_dicts]


@dataclass
class Outcome:
    """What one program did: exit status, output, its own numbers, and its nnwatch run."""

    name: str
    workdir: Path
    returncode: int
    output: str
    records: list[dict[str, Any]] = field(default_factory=list)
    run_dirs: list[Path] = field(default_factory=list)

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.output.splitlines()[-n:])

    def run(self) -> Run:
        if len(self.run_dirs) != 1:
            pytest.fail(
                f"{self.name}: expected one run directory under {self.workdir / 'nnw' / 'runs'}, "
                f"found {len(self.run_dirs)}; exit status {self.returncode}, output:\n{self.tail()}"
            )
        return nnwatch.load_run(self.run_dirs[0])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Run every corpus program at once, each in its own working and run directory."""
    root = tmp_path_factory.mktemp("corpus")
    procs: dict[str, tuple[subprocess.Popen[bytes], Path, Any]] = {}
    for name, prog in PROGRAMS.items():
        work = root / name
        work.mkdir()
        env = dict(os.environ)
        env.update(
            NNWATCH_RUN_DIR=str(work / "nnw"),
            CORPUS_OUT=str(work / "corpus.jsonl"),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env.pop("NNWATCH_DISABLE", None)
        log = open(work / "output.txt", "wb")  # noqa: SIM115 - closed below, after the wait
        cmd = [sys.executable, str(CORPUS / f"{name}.py"), *prog.args]
        procs[name] = (
            subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT),
            work,
            log,
        )
    deadline = time.monotonic() + TIMEOUT
    out: dict[str, Outcome] = {}
    for name, (proc, work, log) in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        records_path = work / "corpus.jsonl"
        records = (
            [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
            if records_path.exists()
            else []
        )
        out[name] = Outcome(
            name=name,
            workdir=work,
            returncode=rc,
            output=(work / "output.txt").read_text(errors="replace"),
            records=records,
            run_dirs=sorted(p for p in (work / "nnw" / "runs").glob("*") if p.is_dir()),
        )
    return out


def _rows_by_update(run: Run) -> dict[int, int]:
    return {int(s): k for k, s in enumerate(run.steps)}


def _same_float32(want: float, got: float) -> bool:
    """Bitwise as float32, with NaN equal to NaN (its payload is not the point)."""
    a, b = np.float32(want), np.float32(got)
    return bool(a == b) or bool(np.isnan(a) and np.isnan(b))


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_exit_status(corpus: dict[str, Outcome], name: str) -> None:
    o = corpus[name]
    if PROGRAMS[name].crashes:
        assert o.returncode != 0, f"{name} should die of its OverflowError:\n{o.tail()}"
        assert "OverflowError" in o.output, o.tail()
    else:
        assert o.returncode == 0, f"{name} exited {o.returncode}:\n{o.tail()}"
        assert "CORPUS_TRAIN_SECONDS" in o.output, o.tail()


@pytest.mark.parametrize("name", TORCH_CLIP)
def test_torch_clip_norm_recorded_bitwise(corpus: dict[str, Outcome], name: str) -> None:
    """On every update the program clipped with torch's clip_grad_norm_, nnwatch's grad_norm is
    the very norm that call returned (float32, bit for bit): no gap, no post-clip value."""
    o = corpus[name]
    mine = [r for r in o.records if r["how"] == "torch_clip"]
    assert len(mine) >= 20, f"{name} recorded only {len(mine)} updates:\n{o.tail()}"
    run = o.run()
    rows = _rows_by_update(run)
    grad_norm = run["grad_norm"]
    bad: list[str] = []
    for r in mine:
        k = rows.get(r["update"])
        if k is None:
            bad.append(f"update {r['update']}: no step record")
        elif not _same_float32(r["norm"], float(grad_norm[k])):
            bad.append(f"update {r['update']}: clip returned {r['norm']!r}, recorded {float(grad_norm[k])!r}")
    assert not bad, (
        f"{name}: {len(bad)} of {len(mine)} updates where torch's clip computed the norm differ; "
        "first ones:\n  " + "\n  ".join(bad[:8])
    )


@pytest.mark.parametrize("name", TORCH_CLIP)
def test_torch_clip_threshold_and_fired_recorded(corpus: dict[str, Outcome], name: str) -> None:
    o = corpus[name]
    mine = [r for r in o.records if r["how"] == "torch_clip"]
    assert mine, f"{name} recorded no updates:\n{o.tail()}"
    assert any(r["clipped"] for r in mine) or name == "hf_style", "the program should clip at times"
    run = o.run()
    rows = _rows_by_update(run)
    threshold, clipped = run["clip_threshold"], run["clipped"]
    bad: list[str] = []
    for r in mine:
        k = rows.get(r["update"])
        if k is None:
            bad.append(f"update {r['update']}: no step record")
            continue
        if float(threshold[k]) != r["max_norm"]:
            bad.append(f"update {r['update']}: clip_threshold {float(threshold[k])!r}, program used {r['max_norm']}")
        if float(clipped[k]) != float(r["clipped"]):
            bad.append(f"update {r['update']}: clipped {float(clipped[k])!r}, program's norm "
                       f"{r['norm']!r} > {r['max_norm']} is {r['clipped']}")
    assert not bad, f"{name}: {len(bad)} mismatches; first ones:\n  " + "\n  ".join(bad[:8])


@pytest.mark.parametrize("name", MEASURED)
def test_measured_norm_is_the_pre_clip_norm(corpus: dict[str, Outcome], name: str) -> None:
    """Without torch's clip (a hand-written rescale, clip_grad_value_, or no clip at all), the
    norm nnwatch measures is that of the accumulated gradients, before the program clips."""
    o = corpus[name]
    mine = [r for r in o.records if r["norm"] is not None]
    assert len(mine) >= 20, f"{name} recorded only {len(mine)} updates:\n{o.tail()}"
    run = o.run()
    rows = _rows_by_update(run)
    measured = run["layer_sums"] != 0
    grad_norm = run["grad_norm"]
    compared = clipped = 0
    bad: list[str] = []
    for r in mine:
        k = rows.get(r["update"])
        if k is None or not measured[k]:
            continue
        compared += 1
        clipped += bool(r.get("clipped"))
        got = float(grad_norm[k])
        if not np.isfinite(got) or abs(got - r["norm"]) > 1e-5 * abs(r["norm"]):
            tag = " (the program clipped this one)" if r.get("clipped") else ""
            bad.append(f"update {r['update']}: program {r['norm']!r}, recorded {got!r}{tag}")
    assert compared >= 5, f"{name}: nnwatch measured only {compared} of the program's updates"
    if PROGRAMS[name].clip == "manual":  # else pre- and post-clip norms would be one number
        assert clipped >= 1, f"{name}: none of the {compared} measured updates was clipped"
    assert not bad, (
        f"{name}: {len(bad)} of {compared} measured updates differ from the pre-clip norm; "
        "first ones:\n  " + "\n  ".join(bad[:8])
    )


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_run_end_status(corpus: dict[str, Outcome], name: str) -> None:
    o = corpus[name]
    run = o.run()
    end_path = run.run_dir / "end.json"
    assert end_path.exists(), f"{name}: no end.json in {run.run_dir}:\n{o.tail()}"
    text = end_path.read_text()
    end = json.loads(text)
    if PROGRAMS[name].crashes:
        assert end["status"] == "crashed", text
        assert "OverflowError" in text, f"end.json does not name the exception: {text}"
        assert len(run) >= 20, f"only {len(run)} steps recorded before the crash"
    else:
        assert end["status"] == "finished", text


_LOADER = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])  # the models' own modules (nanogpt_model, word_lm_model)
    HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
             "_forward_hooks_always_called", "_state_dict_hooks", "_state_dict_pre_hooks",
             "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
    report = []
    for arg in sys.argv[2:]:
        kind, path = arg.split("=", 1)
        entry = {"path": path, "kind": kind, "hooks": []}
        report.append(entry)
        try:
            obj = torch.load(path, weights_only=kind == "state_dict")
        except Exception as exc:
            entry["error"] = repr(exc)
            continue
        entry["type"] = type(obj).__name__
        if isinstance(obj, torch.nn.Module):
            for name, m in obj.named_modules():
                for attr in HOOKS:
                    if getattr(m, attr, None):
                        entry["hooks"].append(f"{name or '<model>'}.{attr}")
            for name, p in obj.named_parameters():
                if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
                    entry["hooks"].append(f"parameter {name}")
        else:
            entry["tensors"] = all(isinstance(v, torch.Tensor) for v in obj.values())
    print(json.dumps({"nnwatch_imported": "nnwatch" in sys.modules, "files": report}))
    """
)


@pytest.fixture(scope="module")
def loaded(corpus: dict[str, Outcome]) -> dict[str, Any]:
    """Every saved file of the corpus, loaded in one fresh process that never imports nnwatch."""
    args: list[str] = []
    for name in SAVES:
        prog, work = PROGRAMS[name], corpus[name].workdir
        args += [f"whole={work / p}" for p in prog.whole_models]
        args += [f"state_dict={work / p}" for p in prog.state_dicts]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", _LOADER, str(CORPUS), *args],
        cwd=CORPUS, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"the loader failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", SAVES)
def test_saved_models_load_without_nnwatch(
    corpus: dict[str, Outcome], loaded: dict[str, Any], name: str
) -> None:
    """What the program saved loads in a fresh process that never imports nnwatch, and carries
    no hook: nnwatch must never end up inside the user's saved objects."""
    o = corpus[name]
    prog = PROGRAMS[name]
    missing = [p for p in (*prog.whole_models, *prog.state_dicts) if not (o.workdir / p).exists()]
    assert not missing, f"{name} did not save {missing} (exit {o.returncode}):\n{o.tail()}"
    assert not loaded["nnwatch_imported"], "loading the saved files imported nnwatch"
    mine = {str(o.workdir / p) for p in (*prog.whole_models, *prog.state_dicts)}
    entries = [e for e in loaded["files"] if e["path"] in mine]
    assert len(entries) == len(mine), loaded["files"]
    for entry in entries:
        assert "error" not in entry, f"{entry['path']} does not load: {entry['error']}"
        assert not entry["hooks"], f"{entry['path']} carries hooks: {entry['hooks']}"
        if entry["kind"] == "whole":
            assert entry["type"] in ("GPT", "RNNModel"), entry
        else:
            assert entry["tensors"], entry


def test_diverging_run_is_reported_exploding(corpus: dict[str, Outcome]) -> None:
    o = corpus["diverging"]
    norms = np.array([r["norm"] for r in o.records], dtype=float)
    assert np.nanmax(norms[np.isfinite(norms)]) > 1e3, "the program itself should diverge"
    run = o.run()
    recorded = np.asarray(run["grad_norm"], dtype=float)
    finite = recorded[np.isfinite(recorded)]
    assert finite.size and finite.max() > 100, f"largest recorded grad_norm: {finite.max() if finite.size else None}"
    kinds = {f.get("kind") for f in run.findings}
    events = (run.run_dir / "events.jsonl").read_text() if (run.run_dir / "events.jsonl").exists() else ""
    assert "exploding_gradients" in kinds or '"exploding_gradients"' in events, (
        f"no exploding_gradients finding; findings: {sorted(k for k in kinds if k)}"
    )


def test_amp_scaler_is_found_without_being_passed(corpus: dict[str, Outcome]) -> None:
    """timm's NativeScaler keeps the GradScaler to itself; the README's two lines do not pass it.
    nnwatch finds it at its first scale() call: the loss scale is on every step's record."""
    o = corpus["amp_timm"]
    run = o.run()
    assert np.isfinite(run["amp_scale"]).all() and (run["amp_scale"] >= 1.0).all()
    assert "GradScaler that was not passed to watch()" in o.output
    assert "clipping_misuse" not in {f.get("kind") for f in run.findings}  # it unscales first


@pytest.mark.parametrize(
    ("name", "micro"), [("gpt_accum", 4), ("hf_style", 2), ("accelerate_glue", 2), ("mnist_cnn", 1)]
)
def test_accumulation_is_known_to_the_initial_loss_check(
    corpus: dict[str, Outcome], name: str, micro: int
) -> None:
    """Backward passes per update reach the detectors: both accumulation loops hand w.step()
    their micro-batch loss divided by the count, which the ln(K) check must not call a leak."""
    run = corpus[name].run()
    assert run.meta.extra["micro_batches"] == micro
    assert "bad_initial_loss" not in {f.get("kind") for f in run.findings}


def test_every_corpus_run_opens_in_the_monitor(corpus: dict[str, Outcome]) -> None:
    """``nnwatch open RUN_DIR`` on each program's run: its last step and loss on screen, no
    reader error, no pane that failed to draw."""
    import asyncio

    from nnwatch.sources.recorded import RecordedSource
    from nnwatch.testing.tui import fixed_hardware, settle
    from nnwatch.tui.app import NNWatchApp
    from nnwatch.tui.widgets.base import Pane

    async def check(name: str) -> None:
        run = corpus[name].run()
        app = NNWatchApp(RecordedSource(run.run_dir), hardware=fixed_hardware, fps=10)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app, len(run))
            assert app.state.history.rows == len(run), name
            assert not app.state.reader_errors, (name, app.state.reader_errors)
            assert [p.key for p in app.query(Pane) if p.draw_error] == [], name
            assert app.state.status.state in ("finished", "crashed"), name

    for name in PROGRAMS:
        asyncio.run(check(name))
