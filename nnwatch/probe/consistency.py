"""Cross-rank consistency: are the data-parallel replicas still training the same model?

DDP keeps replicas identical only if every rank applies the same update. Code that touches the
weights on some ranks only (an edit under ``if rank == 0``, a checkpoint loaded without a
broadcast, parameters DDP does not know about) makes them drift apart silently: the loss still
goes down, and each rank trains a different model. This check catches it, and it carries each
rank's non-finite count with it, so a rank that went NaN is named in every rank's events, on
every node, not only in its own.

How, and what it costs: every ``every`` optimizer steps (default 100), each rank computes one
checksum per parameter tensor, launches **one** ``all_reduce(MAX, async_op=True)`` of a small int64
tensor on the job's existing process group, and reads the result at a later optimizer step, once
the work has completed, so the training thread never waits for it. It is the only collective
nnwatch adds to a replicated job (a sharded one has its norms' instead, see
:mod:`~nnwatch.probe.sharded_reduce`); ``bench/consistency.py`` measures it.

- The checksum of a tensor is the (wrapping) sum of its bytes read as int64 words. Integer sums
  do not depend on reduction order, thread count or kernel, so replicas that are bitwise
  identical (the DDP invariant) give equal checksums on any hardware, and a change of a single
  bit shows. It reads each parameter once, at memory speed.
- One MAX all-reduce gives both extremes of each checksum: the tensor holds ``[c, -c]``, and
  ``max(-c) = -min(c)``. It also holds a block of ``world_size x 2`` slots in which each rank fills
  only its own row (the others hold INT64_MIN), so everyone learns every rank's total checksum
  and non-finite count: that is how the odd rank is named.
- Every rank launches at the same optimizer steps whatever its state, so the collectives always
  match. Before the first check, the ranks agree through the job's key-value store (no
  collective) that each of them runs the check: if ``watch()`` runs on some ranks only, the
  check turns itself off with a warning instead of leaving an all-reduce unmatched. The check hooks the optimizer (``register_step_post_hook``), not ``w.step()``, so a rank
  whose probe switched itself off still takes part. Requirements: ``watch()`` is called on every
  rank with the optimizer, and the parameters are replicated (DDP), not sharded (FSDP, ZeRO):
  with sharded parameters the check turns itself off.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from nnwatch.diagnosis.rank_findings import divergence_finding, nonfinite_finding
from nnwatch.probe.job_summary import JobSummary, SummaryOwner
from nnwatch.probe.job_summary import every_from_env as summary_from_env
from nnwatch.store.schema import FieldName, sums_measured

if TYPE_CHECKING:
    from torch import nn

    from nnwatch.store.finding import Finding
    from nnwatch.store.finding_log import FindingLog
    from nnwatch.tensors.layers import LayerPlan


class CheckOwner(SummaryOwner, Protocol):
    """What the check needs of the run: the step, its recent records, where findings go."""

    @property
    def findings(self) -> FindingLog:
        """The run's findings, where this check adds its own."""


log = logging.getLogger("nnwatch")

DEFAULT_EVERY = 100
#: How long ``close()`` waits for a check still in flight.
CLOSE_WAIT_S = 10.0
#: Slots per rank in the shared block: total checksum, first step with a non-finite loss or
#: activation (-1: none yet), and how many such steps.
RANK_SLOTS = 3
INT64_MIN = torch.iinfo(torch.int64).min
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int32}


def tensor_checksum(t: torch.Tensor) -> torch.Tensor:
    """The sum of the tensor's bytes read as int64 words (wrapping), on the tensor's device.

    Exact and independent of summation order, so it is the same on every rank and kernel for the
    same bits. Summing 8-byte words runs at memory speed; widening int32 to int64 first does not
    (about 40x slower on a CPU).
    """
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    raw = t.reshape(-1).view(torch.uint8)
    whole = raw.numel() // 8 * 8
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    if whole:
        try:
            total = raw[:whole].view(torch.int64).sum()
        except RuntimeError:  # storage not 8-byte aligned: sum 4-byte words, widened
            view = _INT_VIEW.get(t.element_size(), torch.uint8)
            total = t.reshape(-1).view(view).sum(dtype=torch.int64)
            return total
    if whole < raw.numel():
        total = total + raw[whole:].to(torch.int64).sum()
    return total


def parameters_sharded(model: torch.nn.Module, params: list[torch.Tensor]) -> bool:
    """True for FSDP / DTensor / ZeRO-style parameters, whose values legitimately differ by rank."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - older torch
        DTensor = ()  # type: ignore[assignment,misc]  # noqa: N806
    if any(isinstance(p, DTensor) or hasattr(p, "_is_sharded") for p in params):
        return True
    sharded_types = ("FullyShardedDataParallel", "FSDPModule", "DeepSpeedEngine")
    return any(type(m).__name__ in sharded_types for m in model.modules())


@dataclass
class _Pending:
    step: int
    buf: torch.Tensor
    work: Any
    host: torch.Tensor | None = None
    event: Any = None


@dataclass
class ConsistencyResult:
    """One evaluated check, as every rank sees it."""

    step: int
    diverged: list[int]  # indices of parameter tensors whose checksums differ across ranks
    totals: list[int]  # each rank's total checksum
    nonfinite: list[int]  # each rank's count of steps with a non-finite loss or activation
    first_nonfinite: list[int] = field(default_factory=list)  # each rank's first such step, or -1
    odd_ranks: list[int] = field(default_factory=list)


class ConsistencyCheck:
    """Owned by a watched run (:class:`~nnwatch.probe.watched_run.WatchedRun`); see the module
    docstring."""

    def __init__(
        self,
        w: CheckOwner,
        model: nn.Module,
        plan: LayerPlan,
        optimizer: torch.optim.Optimizer,
        every: int = DEFAULT_EVERY,
        *,
        group: Any = None,
        summary_every: int = 0,
    ) -> None:
        import torch.distributed as dist

        self.w = w
        self.every = int(every)  # 0: no checksum compare (the slot may still carry the summary)
        self.group = group
        self.dist = dist
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.params = [p for p in plan.params]
        names = {id(p): n for n, p in model.named_parameters()}
        self.names = [names.get(id(p), f"param{i}") for i, p in enumerate(self.params)]
        self.device = self._comm_device()
        self.optimizer_steps = 0
        self.checks = 0
        self.results: list[ConsistencyResult] = []
        self._pending: deque[_Pending] = deque()  # launched, not read yet, oldest first
        self._handle = optimizer.register_step_post_hook(self._on_optimizer_step)
        self._nonfinite = 0  # this rank's steps with a non-finite loss or activation
        self._first_nonfinite = -1  # the first of them
        self._loss_seen = False
        self._scanned = -1.0  # the last step whose record was counted
        self._diverged_reported = False
        self._last_clean: int | None = None  # step of the last check that found no drift
        self._nonfinite_known: set[int] = set()  # ranks already reported as non-finite
        self.closed = False
        self.error: str | None = None
        self.agreed: bool | None = None  # every rank runs the check (decided at the first one)
        self.summary: JobSummary | None = None
        if summary_every > 0:
            self.summary = JobSummary(
                w, summary_every, rank=self.rank, world=self.world, group=group, device=self.device
            )
        self._store, self._key = _register(self.world, self.every, summary_every, self.summary)

    @classmethod
    def create(
        cls,
        w: CheckOwner,
        model: nn.Module,
        plan: LayerPlan,
        optimizer: torch.optim.Optimizer | None,
        every: int | None,
        summary_every: int | None = None,
    ) -> ConsistencyCheck | None:
        """A check for ``w`` when it makes sense (distributed, with an optimizer): the checksum
        compare for replicated parameters, and the job summary when asked for."""
        every = every_from_env() if every is None else int(every)
        summary_every = summary_from_env() if summary_every is None else int(summary_every)
        every, summary_every = max(0, every), max(0, summary_every)
        if (every <= 0 and summary_every <= 0) or optimizer is None or not plan.params:
            return None
        try:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return None
            if every and parameters_sharded(model, list(plan.params)):
                log.info("nnwatch: parameters are sharded; the cross-rank consistency check is off")
                every = 0
                if not summary_every:
                    return None
            return cls(w, model, plan, optimizer, every, summary_every=summary_every)
        except Exception as exc:  # noqa: BLE001 - the check is optional; training goes on
            log.warning("nnwatch: the cross-rank consistency check is off: %r", exc)
            return None

    def _comm_device(self) -> torch.device:
        backend = str(self.dist.get_backend(self.group)).lower()
        dev = self.params[0].device
        if dev.type == "cuda" and "nccl" in backend:
            return dev
        if "gloo" in backend or dev.type == "cpu":
            return torch.device("cpu")
        return dev

    # -- training thread -------------------------------------------------------------------------
    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.closed:
            return
        self.optimizer_steps += 1
        try:
            self._poll()
        except Exception as exc:  # noqa: BLE001 - a failed read only loses this check
            self._fail(f"could not read a consistency check: {exc!r}")
        # the slot: the checksum compare, then the job summary, at counts every rank shares, in
        # this order on every rank, so the two collectives never interleave differently
        n = self.optimizer_steps
        check_due = self.every > 0 and n % self.every == 0
        summary = self.summary
        summary_due = summary is not None and n % summary.every == 0
        if not (check_due or summary_due):
            return
        if self.agreed is None:
            self.agreed = self._everyone_takes_part()
            if self.agreed and summary is not None:
                summary.agreed()
        if not self.agreed:
            self.close()
            return
        if check_due:
            self._launch()
        if summary_due and summary is not None:
            try:
                self._scan_records()
            except Exception:  # noqa: BLE001 - the counts stay as they were
                pass
            summary.launch(self._nonfinite, self._first_nonfinite)

    def _everyone_takes_part(self) -> bool:
        """True when every rank of the group created this check. Decided once, from the job's
        key-value store (not a collective): a rank without nnwatch, e.g. ``watch()`` called on
        rank 0 only, would leave the others' all-reduce unmatched and hang or corrupt the job."""
        if self._store is None:
            log.warning("nnwatch: no process-group store to agree on; the consistency check is off")
            return False
        try:
            count = int(self._store.add(self._key, 0))
        except Exception as exc:  # noqa: BLE001
            log.warning("nnwatch: the consistency check is off: %r", exc)
            return False
        if count < self.world:
            log.warning(
                "nnwatch: the cross-rank consistency check is off: nnwatch watches %d of %d ranks; "
                "call watch() on every rank to compare them",
                count,
                self.world,
            )
            return False
        return True

    def _launch(self) -> None:
        """Launch this step's all-reduce. Every rank launches, whatever happened before, and
        never waits for an earlier one: a rank that stopped stepping is not waited for here."""
        P, K, W = len(self.params), RANK_SLOTS, self.world
        buf = torch.full((W * K + 2 * P,), INT64_MIN, dtype=torch.int64, device=self.device)
        try:
            self._scan_records()
            with torch.no_grad():
                sums = torch.stack([tensor_checksum(p) for p in self.params]).to(self.device)
                buf[W * K : W * K + P] = sums
                buf[W * K + P :] = -sums
                buf[self.rank * K] = sums.sum()
                buf[self.rank * K + 1] = self._first_nonfinite
                buf[self.rank * K + 2] = self._nonfinite
        except Exception as exc:  # noqa: BLE001 - still take part, with what we have
            self._fail(f"could not compute the parameter checksum: {exc!r}")
        work = self.dist.all_reduce(buf, op=self.dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending.append(_Pending(self.w.step_index, buf, work))
        self.checks += 1

    def _poll(self) -> None:
        """Read the checks that completed, oldest first; stop at the first one still running."""
        while self._pending:
            p = self._pending[0]
            if p.host is None:
                if not p.work.is_completed():
                    return
                if p.buf.device.type == "cpu":
                    self._pending.popleft()
                    p.work.wait()  # completed: raises if it failed, returns at once otherwise
                    self._finish(p, p.buf)
                    continue
                p.host = torch.empty(p.buf.shape, dtype=p.buf.dtype, pin_memory=True)
                p.host.copy_(p.buf, non_blocking=True)
                p.event = torch.cuda.Event()
                p.event.record()
                return
            if not p.event.query():
                return
            self._pending.popleft()
            self._finish(p, p.host)

    # -- evaluation (training thread, on host numbers only) --------------------------------------
    def _finish(self, p: _Pending, host: torch.Tensor) -> None:
        data = host.numpy().astype(np.int64, copy=False)
        P, K, W = len(self.params), RANK_SLOTS, self.world
        block = data[: W * K].reshape(W, K)
        hi, lo = data[W * K : W * K + P], -data[W * K + P :]
        diverged = np.flatnonzero(hi != lo).tolist()
        totals = block[:, 0].tolist()
        result = ConsistencyResult(p.step, diverged, totals, block[:, 2].tolist(), block[:, 1].tolist())
        result.odd_ranks = odd_ranks(totals)
        self.results.append(result)
        if diverged and not self._diverged_reported:
            self._diverged_reported = True
            self.w.findings.add(self._divergence_finding(result))
        elif not diverged:
            self._diverged_reported = False
            self._last_clean = p.step
        self._report_nonfinite(result)

    def _divergence_finding(self, r: ConsistencyResult) -> Finding:
        return divergence_finding(
            r.step, self.names[r.diverged[0]], len(r.diverged), len(self.params), r.odd_ranks,
            self.world, self.rank, self.every, self._last_clean,
        )

    def _report_nonfinite(self, r: ConsistencyResult) -> None:
        """Name the rank(s) that went non-finite, first the origin: every rank writes it, so it
        is in the events of whichever node a user watches."""
        bad = {i: step for i, step in enumerate(r.first_nonfinite) if step >= 0}
        if not set(bad) - self._nonfinite_known:
            return
        self._nonfinite_known |= set(bad)
        self.w.findings.add(nonfinite_finding(r.step, bad, self.world, self.rank))

    # -- this rank's own records ---------------------------------------------------------------
    def _scan_records(self) -> None:
        """Count this rank's steps whose loss or activations went non-finite, for the others.

        Only what was measured counts: the layer output sums of a step the cost budget skipped
        are NaN ("not measured", ``layer_sums == 0``), and the gradients are not read here at all.

        Reads the records published since the last check from the probe's in-memory window of
        recent steps (the last 500), on the training thread, so the count is exact at launch.
        """
        rows = self.w.files.recent_records(self.w.schema)
        if not len(rows):
            return
        rows = rows[rows["step"] > self._scanned]
        if not len(rows):
            return
        self._scanned = float(rows["step"][-1])
        loss = rows["loss"].astype(np.float64)
        finite = np.isfinite(loss)
        bad = np.isinf(loss)
        bad |= np.isnan(loss) & (np.maximum.accumulate(finite) | self._loss_seen)
        self._loss_seen = self._loss_seen or bool(finite.any())
        if FieldName.ACT_SUM in (rows.dtype.names or ()):
            act = rows[FieldName.ACT_SUM].reshape(len(rows), -1)
            if act.shape[1]:
                # NaN is "not measured" on the steps the cost budget left out, never "non-finite"
                bad |= ~np.isfinite(act).all(axis=1) & sums_measured(rows)
        n = int(np.count_nonzero(bad))
        if n and self._first_nonfinite < 0:
            self._first_nonfinite = int(rows["step"][int(np.argmax(bad))])
        self._nonfinite += n

    # ------------------------------------------------------------------------------------------
    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.warning("nnwatch: %s", message)

    def close(self, ending: dict[str, Any] | None = None) -> None:
        """Stop checking. A check still in flight is waited for, briefly: every rank launched it
        at the same step, so it completes unless a rank is gone, and a process group torn down
        under a running collective aborts the process. ``ending`` (how the run ended) goes to
        the job summary, which tells rank 0."""
        if self.closed:
            return
        self.closed = True
        try:
            self._handle.remove()
        except Exception:  # noqa: BLE001
            pass
        pending, self._pending = list(self._pending), deque()
        from datetime import timedelta

        for p in pending:
            try:
                p.work.wait(timedelta(seconds=CLOSE_WAIT_S))
                self._finish(p, p.buf.cpu())
            except Exception:  # noqa: BLE001 - a rank is gone; nothing left to compare
                break
        if self.summary is not None:
            self.summary.close(ending)


_created = 0  # checks this process created: the same sequence on every rank


def _register(
    world: int, every: int = DEFAULT_EVERY, summary_every: int = 0, summary: JobSummary | None = None
) -> tuple[Any, str]:
    """Count this rank in for the check it is creating, in the default group's store.

    The key holds the launcher's restart count, the check's index in this process and both
    cadences, so a restarted job or a second run in the same processes counts afresh, and ranks
    that were given different cadences never count each other in (their collectives would not
    match). The job summary sets its first beat before the rank counts itself in.
    """
    global _created
    _created += 1
    key = (
        f"nnwatch/consistency/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        f"{_created}/{world}"
    )
    if summary_every:
        key += f"/{every}/{summary_every}"
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
        if summary is not None:
            summary.register(store, f"{key}/job")
        store.add(key, 1)
    except Exception as exc:  # noqa: BLE001 - private API or store trouble: no check
        log.info("nnwatch: cannot register for the consistency check: %r", exc)
        return None, key
    return store, key


def odd_ranks(totals: list[int]) -> list[int]:
    """Ranks outside the one strict majority of equal checksums; [] when there is no majority."""
    values, counts = np.unique(np.asarray(totals, dtype=np.int64), return_counts=True)
    if len(values) < 2:
        return []
    best = int(np.argmax(counts))
    if counts[best] * 2 <= len(totals):
        return []
    return [i for i, t in enumerate(totals) if t != values[best]]


def every_from_env(default: int = DEFAULT_EVERY) -> int:
    """``NNWATCH_CONSISTENCY_EVERY`` overrides the default interval (0 turns the check off)."""
    raw = os.environ.get("NNWATCH_CONSISTENCY_EVERY")
    try:
        return default if raw is None else int(raw)
    except ValueError:
        return default
