"""Replay a snapshot: rebuild the model, restore the step's state and RNG, re-run forward and backward.

On the CPU a replay must reproduce the recorded loss and pre-clip gradient norm bit for bit (same
weights, same batch, same RNG, same thread count). Then the step can be examined at leisure:
``anomaly=True`` re-runs it under ``torch.autograd.detect_anomaly()`` to name the backward op that
produced the NaN (e.g. ``LogBackward0``) and the user's source line that created it, and watches every
forward op for the first one that turned finite inputs into NaN/Inf.

No code is unpickled: every file is read with ``torch.load(weights_only=True)``. The model comes from
the user's own factory, ``module:function`` or ``path/to/file.py:function``, which returns either the
model or a dict ``{"model": model, "loss_fn": loss_fn}`` where ``loss_fn(model, batch)`` returns the
loss exactly as the training loop computes it (forward included). Without ``loss_fn`` the batch must
be ``(inputs, targets)`` of a run with ``num_classes``, and the loss is ``F.cross_entropy(model(inputs), targets)``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnwatch.diagnosis import snapshot as snap


class ReplayError(RuntimeError):
    """A replay cannot run; the message says what is wrong and what to do."""


# ------------------------------------------------------------------------------------------------
# loading


@dataclass
class Snapshot:
    """A snapshot directory. Tensors are loaded on demand, always with ``weights_only=True``."""

    path: Path
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    def _load(self, name: str) -> Any:
        import torch

        p = self.path / name
        if not p.exists():
            raise ReplayError(f"{p} is missing: the snapshot is incomplete")
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises several types for a bad file
            raise ReplayError(
                f"{p} cannot be loaded safely (weights_only=True): {exc}. nnwatch never unpickles "
                "code from a snapshot"
            ) from exc

    def state(self) -> dict[str, Any]:
        return self._load(snap.STATE)

    def rng(self) -> dict[str, Any]:
        return self._load(snap.RNG)

    def batch(self) -> Any:
        if not self.manifest.get("has", {}).get("batch"):
            raise ReplayError(
                "this snapshot has no batch: the training loop called w.step(loss) without "
                "batch=...; pass the batch (w.step(loss, batch=batch)) so that steps can be replayed"
            )
        return self._load(snap.BATCH)

    def metrics(self) -> np.ndarray:
        p = self.path / snap.METRICS
        return np.load(p, allow_pickle=False) if p.exists() else np.zeros(0)

    def findings(self) -> list[dict[str, Any]]:
        p = self.path / snap.FINDINGS
        return json.loads(p.read_text()) if p.exists() else []

    def original(self) -> dict[str, Any] | None:
        """The recorded loss and gradient norm of this step (float32), or None if unknown."""
        p = self.path / snap.RECORD
        rec = snap.read_record(p) if p.exists() else None  # None when damaged: use the run log
        if rec is not None:
            return {
                "loss": _from_bits(rec.get("loss_bits")),
                "grad_norm": _from_bits(rec.get("grad_norm_bits")),
                "clip_threshold": _json_float(rec.get("clip_threshold")),
                "source": str(p),
            }
        run_dir = Path(self.manifest.get("run_dir", ""))
        for candidate in (self.path.parent.parent, run_dir):
            try:
                from nnwatch.store.runlog import load_run

                run = load_run(candidate)
            except Exception:  # noqa: BLE001 - not a run directory: try the next
                continue
            hit = np.flatnonzero(np.asarray(run.scalars["step"]) == self.step)
            if hit.size:
                r = run.scalars[int(hit[-1])]
                return {
                    "loss": np.float32(r["loss"]),
                    "grad_norm": np.float32(r["grad_norm"]),
                    "clip_threshold": float(r["clip_threshold"]),
                    "source": str(candidate / "scalars.bin"),
                }
        return None


def load_snapshot(path: str | Path) -> Snapshot:
    """Open a snapshot directory (``<run>/snapshots/step-N``); a run directory picks its latest."""
    p = Path(path).expanduser()
    if (p / snap.SNAPSHOTS_DIR).is_dir() and not (p / snap.MANIFEST).exists():
        found = sorted(
            (
                d
                for d in (p / snap.SNAPSHOTS_DIR).iterdir()
                if d.is_dir() and not d.name.startswith(".")
            ),
            key=lambda d: d.stat().st_mtime,
        )
        if not found:
            raise ReplayError(f"{p} is a run directory without snapshots")
        p = found[-1]
    m = p / snap.MANIFEST
    if not m.exists():
        raise ReplayError(
            f"{p} is not an nnwatch snapshot (no {snap.MANIFEST}); pass a directory like "
            "<run>/snapshots/step-N"
        )
    try:
        manifest = snap.read_manifest(m)  # every field checked; one plain line when it is not
    except snap.SnapshotError as exc:
        raise ReplayError(str(exc)) from exc
    if int(manifest.get("version", 0)) > snap.SNAPSHOT_VERSION:
        raise ReplayError(f"{p} was written by a newer nnwatch; upgrade nnwatch to replay it")
    return Snapshot(p, manifest)


def load_factory(spec: str) -> Callable[[], Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the function (called later, no args)."""
    if ":" not in spec:
        raise ReplayError(
            f"--model {spec!r} must look like module:function or path/to/file.py:function "
            "(a function that returns the model, or {'model': ..., 'loss_fn': ...})"
        )
    mod_name, _, attr = spec.rpartition(":")
    try:
        if mod_name.endswith(".py") or "/" in mod_name or "\\" in mod_name:
            path = Path(mod_name).expanduser().resolve()
            if not path.exists():
                raise ReplayError(f"{path} does not exist")
            sys.path.insert(0, str(path.parent))
            unique = f"nnwatch_replay_factory_{abs(hash(str(path)))}"
            spec_obj = importlib.util.spec_from_file_location(unique, path)
            if spec_obj is None or spec_obj.loader is None:
                raise ReplayError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec_obj)
            sys.modules[unique] = module
            spec_obj.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except ReplayError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        raise ReplayError(f"importing {mod_name!r} failed: {exc!r}") from exc
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ReplayError(f"{mod_name!r} has no function {attr!r}")
    return fn


# ------------------------------------------------------------------------------------------------
# results


@dataclass
class SourceLine:
    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class AnomalyReport:
    """What ``detect_anomaly`` and the forward op watch found."""

    backward_op: str | None = None
    backward_error: str | None = None
    backward_source: SourceLine | None = None
    backward_traceback: str = ""
    forward_op: str | None = None
    forward_source: SourceLine | None = None


@dataclass
class ReplayResult:
    step: int
    loss: float
    grad_norm: float
    original_loss: float | None
    original_grad_norm: float | None
    loss_bits: str
    grad_norm_bits: str
    original_loss_bits: str | None
    original_grad_norm_bits: str | None
    grad_norm_method: str
    forward_nonfinite_module: str | None
    backward_nonfinite_module: str | None
    anomaly: AnomalyReport | None = None
    original_source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def loss_matches(self) -> bool | None:
        return _same(self.loss_bits, self.original_loss_bits)

    @property
    def grad_norm_matches(self) -> bool | None:
        return _same(self.grad_norm_bits, self.original_grad_norm_bits)

    @property
    def reproduced(self) -> bool:
        """True when both the loss and the gradient norm reproduce bit for bit."""
        return bool(self.loss_matches) and bool(self.grad_norm_matches)

    def report(self) -> str:
        lines = [f"replayed step {self.step}"]

        def cmp(
            label: str,
            now: float,
            bits: str,
            orig: float | None,
            obits: str | None,
            ok: bool | None,
        ) -> str:
            if orig is None:
                return f"  {label:<10} {_num(now)} ({bits}); the original value is unknown"
            verdict = "identical, bit for bit" if ok else "DIFFERENT"
            return f"  {label:<10} original {_num(orig)} ({obits})  replay {_num(now)} ({bits})  -> {verdict}"

        lines.append(
            cmp(
                "loss",
                self.loss,
                self.loss_bits,
                self.original_loss,
                self.original_loss_bits,
                self.loss_matches,
            )
        )
        lines.append(
            cmp(
                "grad norm",
                self.grad_norm,
                self.grad_norm_bits,
                self.original_grad_norm,
                self.original_grad_norm_bits,
                self.grad_norm_matches,
            )
        )
        if self.forward_nonfinite_module:
            lines.append(
                f"  forward: first non-finite module output: {self.forward_nonfinite_module}"
            )
        if self.backward_nonfinite_module:
            lines.append(
                f"  backward: first parameter-owning module with non-finite gradients: {self.backward_nonfinite_module}"
            )
        a = self.anomaly
        if a is not None:
            if a.forward_op:
                where = f" at {a.forward_source}" if a.forward_source else ""
                lines.append(
                    f"  forward op that first turned finite inputs into NaN/Inf: {a.forward_op}{where}"
                )
                if a.forward_source and a.forward_source.code:
                    lines.append(f"      {a.forward_source.code}")
            if a.backward_op:
                where = f" at {a.backward_source}" if a.backward_source else ""
                lines.append(f"  anomaly: {a.backward_op}{where}")
                if a.backward_source and a.backward_source.code:
                    lines.append(f"      {a.backward_source.code}")
                if a.backward_error:
                    lines.append(f"      ({a.backward_error})")
            elif not a.forward_op:
                lines.append("  anomaly mode found no NaN in the backward pass")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# the replay


def replay(
    snapshot: str | Path | Snapshot,
    factory: Callable[[], Any] | str | None = None,
    *,
    model: Any = None,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    anomaly: bool = False,
    device: str = "cpu",
) -> ReplayResult:
    """Re-run the snapshot's step. Give ``factory`` (callable or ``"module:function"``) or ``model``."""
    import torch

    snp = snapshot if isinstance(snapshot, Snapshot) else load_snapshot(snapshot)
    man = snp.manifest
    if model is None:
        if factory is None:
            raise ReplayError("give the model factory (--model module:function)")
        fn = load_factory(factory) if isinstance(factory, str) else factory
        try:
            built = fn()
        except Exception as exc:  # noqa: BLE001 - the user's factory failed
            raise ReplayError(f"the model factory raised {exc!r}") from exc
        if isinstance(built, dict):
            model = built.get("model")
            loss_fn = loss_fn or built.get("loss_fn")
        else:
            model = built
    if not isinstance(model, torch.nn.Module):
        raise ReplayError(
            f"the factory returned {type(model).__name__}, not a torch.nn.Module (or a dict with 'model')"
        )
    state = snp.state()
    if "model" not in state:
        raise ReplayError("the snapshot holds no model state_dict")
    weights = _match_prefix(state["model"], model)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise ReplayError(
            "the factory builds a different model than the one snapshotted "
            f"({man.get('model_class')}): {str(exc).splitlines()[0]}"
        ) from exc
    batch = snp.batch()
    if loss_fn is None:
        loss_fn = _default_loss(batch, man)
    notes: list[str] = []
    dev = torch.device(device)
    model.to(dev)
    batch = _to_device(batch, dev)
    model.train(bool(man.get("model_training", True)))
    if str(man.get("device", "cpu")).split(":")[0] != dev.type:
        notes.append(
            f"the step ran on {man.get('device')} and is replayed on {dev}: bitwise equality is only expected on the same device type"
        )
    rng = snp.rng()
    threads = int(man.get("num_threads") or torch.get_num_threads())
    from nnwatch.tensors.layers import plan_layers

    plan = plan_layers(model)
    first_bad: list[str] = []
    loss = _run_once(model, plan.params, batch, rng, loss_fn, threads, dev, first_bad, None)
    report = None
    if anomaly:
        # A second pass, under anomaly mode: its backward stops at the first NaN, so the bitwise
        # check above uses the plain pass. Reload the state in case the forward updated buffers.
        grads_plain = [None if p.grad is None else p.grad.clone() for p in plan.params]
        model.load_state_dict(weights)
        report = AnomalyReport()
        _run_once(model, plan.params, batch, rng, loss_fn, threads, dev, [], report)
        for p, g in zip(plan.params, grads_plain, strict=True):
            p.grad = g
    value = loss.detach().float().mean() if loss.numel() != 1 else loss.detach().float().reshape(())
    loss32 = np.float32(value.cpu().item())
    grads = [p.grad for p in plan.params if p.grad is not None]
    orig = snp.original()
    gn_probe, gn_torch = _grad_norms(grads, plan.params, dev)
    clip = orig.get("clip_threshold") if orig else None
    method = "probe (measured before optimizer.step)"
    gn = gn_probe
    if (
        orig is not None
        and not _same(_bits(gn_probe), _bits(orig["grad_norm"]))
        and _same(_bits(gn_torch), _bits(orig["grad_norm"]))
    ):
        gn, method = gn_torch, "clip_grad_norm_ (w.clip_grad_norm_)"
    elif clip is not None and math.isfinite(clip):
        gn, method = gn_torch, "clip_grad_norm_ (w.clip_grad_norm_)"
    bwd = None
    for j in range(len(plan.param_layer_names) - 1, -1, -1):
        own = [
            p
            for p, k in zip(plan.params, plan.param_layer_index, strict=True)
            if k == j and p.grad is not None
        ]
        if any(g.grad is not None and not bool(torch.isfinite(g.grad).all()) for g in own):
            bwd = plan.param_layer_names[j]
            break
    if orig is None:
        notes.append(
            "the original loss and gradient norm were not found (no record.json, no run log next to the snapshot)"
        )
    elif orig is not None and not _same(_bits(gn), _bits(orig["grad_norm"])):
        notes.append(
            "if the training loop clips with torch.nn.utils.clip_grad_norm_ directly, the recorded norm is "
            "the clipped one; clip with w.clip_grad_norm_(max_norm) to record the norm before clipping"
        )
    if (
        report is not None
        and report.backward_op is None
        and report.forward_op is None
        and math.isfinite(float(loss32))
    ):
        notes.append("the loss and gradients are finite: this step holds no NaN to trace")
    return ReplayResult(
        step=snp.step,
        loss=float(loss32),
        grad_norm=float(gn),
        original_loss=None if orig is None else float(orig["loss"]),
        original_grad_norm=None if orig is None else float(orig["grad_norm"]),
        loss_bits=_bits(loss32),
        grad_norm_bits=_bits(gn),
        original_loss_bits=None if orig is None else _bits(orig["loss"]),
        original_grad_norm_bits=None if orig is None else _bits(orig["grad_norm"]),
        grad_norm_method=method,
        forward_nonfinite_module=first_bad[0] if first_bad else None,
        backward_nonfinite_module=bwd,
        anomaly=report,
        original_source=None if orig is None else orig.get("source"),
        notes=notes,
    )


def _run_once(
    model: Any,
    params: Any,
    batch: Any,
    rng: dict[str, Any],
    loss_fn: Callable[[Any, Any], Any],
    threads: int,
    dev: Any,
    first_bad: list[str],
    report: AnomalyReport | None,
) -> Any:
    """Restore the RNG, run forward and backward once; gradients are left in ``p.grad``."""
    import torch

    for p in params:
        p.grad = None
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    hooks = _forward_watch(model, first_bad)
    try:
        snap.restore_rng(rng, cuda=dev.type == "cuda")
        with _anomaly(report):
            loss = loss_fn(model, batch)
            if not isinstance(loss, torch.Tensor):
                raise ReplayError(f"loss_fn returned {type(loss).__name__}, not a tensor")
            try:
                (loss if loss.numel() == 1 else loss.float().mean()).backward()
            except RuntimeError as exc:
                if report is None:
                    raise
                report.backward_error = str(exc).splitlines()[0]
                m = re.search(r"Function '(\w+)'", str(exc))
                if m and not report.backward_op:
                    report.backward_op = m.group(1)
    finally:
        for h in hooks:
            h.remove()
        torch.set_num_threads(prev_threads)
    return loss


def _match_prefix(weights: dict[str, Any], model: Any) -> dict[str, Any]:
    """Strip the ``module.`` / ``_orig_mod.`` prefix that DDP / torch.compile wrappers add, when
    the factory builds the bare model."""
    want = set(model.state_dict())
    for prefix in ("module.", "_orig_mod."):
        if (
            weights
            and all(k.startswith(prefix) for k in weights)
            and not any(k.startswith(prefix) for k in want)
        ):
            weights = {k[len(prefix) :]: v for k, v in weights.items()}
    return weights


def _default_loss(batch: Any, man: dict[str, Any]) -> Callable[[Any, Any], Any]:
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and man.get("num_classes"):
        import torch.nn.functional as F

        def ce(model: Any, b: Any) -> Any:
            return F.cross_entropy(model(b[0]), b[1])

        return ce
    raise ReplayError(
        "cannot tell how the loss was computed: let the factory return "
        "{'model': model, 'loss_fn': loss_fn} with loss_fn(model, batch) -> loss, computed exactly "
        "as in the training loop"
    )


def _grad_norms(grads: list[Any], params: Any, dev: Any) -> tuple[np.float32, np.float32]:
    """The global norm as the probe measures it, and as clip_grad_norm_ does (float32 each)."""
    import torch

    from nnwatch import grad as gradmath
    from nnwatch.tensors.grad_norms import squared_norms, total_norm

    if not grads:
        return np.float32(np.nan), np.float32(np.nan)
    probe = float(total_norm(squared_norms(grads, dev)))
    with_grad = [p for p in params if p.grad is not None]
    total = gradmath.global_norm(with_grad, 2.0)
    return (
        np.float32(probe),
        np.float32(total.to(torch.float32).cpu().item()),
    )


def _forward_watch(model: Any, first_bad: list[str]) -> list[Any]:
    """Module hooks that note the first module (in call order) whose output holds NaN/Inf."""
    import torch

    from nnwatch.tensors.layers import first_tensor

    hooks = []
    for name, mod in model.named_modules():
        label = name or type(model).__name__

        def hook(m: Any, args: Any, out: Any, label: str = label) -> None:
            t = first_tensor(out)
            if not first_bad and t is not None and not bool(torch.isfinite(t).all()):
                first_bad.append(f"{label} ({type(m).__name__})")

        hooks.append(mod.register_forward_hook(hook))
    return hooks


@contextlib.contextmanager
def _anomaly(report: AnomalyReport | None) -> Iterator[None]:
    if report is None:
        yield
        return
    import torch

    with warnings.catch_warnings(record=True) as caught, _FirstNonFiniteOp(report):
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly(check_nan=True):
            yield
    for w in caught:
        text = str(w.message)
        m = re.search(
            r"Error detected in (\w+)\. Traceback of forward call that caused the error:\n(.*)",
            text,
            re.S,
        )
        if m:
            report.backward_op = m.group(1)
            report.backward_traceback = m.group(2)
            report.backward_source = _user_frame_from_text(m.group(2))
            break


_FRAME_RE = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[^\n]+)\n(?P<code>[^\n]*)'
)


def _is_library(path: str) -> bool:
    import torch

    p = str(Path(path).resolve()) if not path.startswith("<") else path
    lib_dirs = (str(Path(torch.__file__).parent), str(Path(__file__).resolve().parent.parent))
    return path.startswith("<") or any(p.startswith(d) for d in lib_dirs)


def _user_frame_from_text(tb: str) -> SourceLine | None:
    frames = [
        SourceLine(m["file"], int(m["line"]), m["fn"].strip(), m["code"].strip())
        for m in _FRAME_RE.finditer(tb)
    ]
    user = [f for f in frames if not _is_library(f.file)]
    chosen = user or frames
    return chosen[-1] if chosen else None


def _user_frame_here() -> SourceLine | None:
    for fs in reversed(traceback.extract_stack()[:-2]):
        if not _is_library(fs.filename):
            return SourceLine(fs.filename, fs.lineno or 0, fs.name, (fs.line or "").strip())
    return None


class _FirstNonFiniteOp:
    """A TorchFunctionMode that records the first op whose floating inputs were all finite but whose
    output was not: where a NaN/Inf is born in the forward pass (replay only; it checks every op)."""

    def __init__(self, report: AnomalyReport) -> None:
        from torch.overrides import TorchFunctionMode

        outer = self

        class Mode(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                if report.forward_op is None and outer.armed:
                    outer.check(func, args, kwargs or {}, out)
                return out

        self.mode = Mode()
        self.report = report
        self.armed = True

    def check(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        import torch

        outs = [t for t in _tensors(out) if t.is_floating_point()]
        if not outs:
            return
        if all(bool(torch.isfinite(t).all()) for t in outs):
            return
        ins = [t for t in _tensors((args, kwargs)) if t.is_floating_point()]
        if any(not bool(torch.isfinite(t).all()) for t in ins):
            return
        self.report.forward_op = op_name(func)
        self.report.forward_source = _user_frame_here()

    def __enter__(self) -> _FirstNonFiniteOp:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)


def op_name(func: Any) -> str:
    """A readable name for a torch function: torch.log, Tensor.exp, torch.nn.functional.softmax."""
    name = getattr(func, "__name__", None) or repr(func)
    qual = getattr(func, "__qualname__", "") or ""
    mod = getattr(func, "__module__", None) or ""
    if qual.startswith("_VariableFunctionsClass.") or mod == "torch":
        return f"torch.{name}"
    if qual.startswith(("TensorBase.", "_TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    if mod.startswith("torch"):
        return f"{mod.replace('torch._C._nn', 'torch.nn.functional')}.{name}"
    return qual or name


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _to_device(obj: Any, dev: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, dict):
        return {k: _to_device(v, dev) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_to_device(v, dev) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _bits(x: Any) -> str:
    return f"0x{int(np.float32(x).view(np.uint32)):08x}"


def _same(a: str | None, b: str | None) -> bool | None:
    if a is None or b is None:
        return None
    if a == b:
        return True
    fa, fb = _from_bits(a), _from_bits(b)
    return bool(np.isnan(fa) and np.isnan(fb))  # NaN payloads may differ; both NaN counts as equal


def _from_bits(bits: str | None) -> np.float32:
    if bits is None:
        return np.float32(np.nan)
    return np.array([int(bits, 16)], dtype=np.uint32).view(np.float32)[0]


def _json_float(v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, str):
        return float(v) if v in ("inf", "-inf") else math.nan
    return float(v)


def _num(x: float) -> str:
    return repr(float(x)) if math.isfinite(x) else str(x)
