"""Naming the op that produced a NaN: ``detect_anomaly`` for backward, a dispatch watch for forward.

A replay under ``anomaly=True`` runs the step inside :func:`anomaly_mode`: autograd's anomaly mode
names the backward op whose output went non-finite (e.g. ``LogBackward0``) and the user's source
line that created it, and a ``TorchDispatchMode`` sees every forward op, so the first one that turned
finite inputs into NaN/Inf is named too. :func:`forward_watch` notes the first module whose output
holds NaN/Inf.
"""

from __future__ import annotations

import contextlib
import re
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


def forward_watch(model: Any, first_bad: list[str]) -> list[Any]:
    """Module hooks that note the first module (in call order) whose output holds NaN/Inf."""
    import torch

    from nnwatch.tensors.layers import first_tensor  # lazy: pulls torch; diagnosis stays torch-free

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
def anomaly_mode(report: AnomalyReport | None) -> Iterator[None]:
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

        self.mode: Any = Mode()
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
