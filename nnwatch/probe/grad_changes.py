"""What happened to the gradients between the probe's looks at them, read without a sync where
it can be: were the last update's gradients cleared before this step's backward (``grads_kept``),
and did something change them between the end of backward and the update (a clip by value, a
rescale by hand)? Owned by the :class:`~nnwatch.probe.grad_recorder.GradientRecorder`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence

import torch

from nnwatch.probe.buffers import DEV_INDEX, StepBuffers
from nnwatch.store.schema import FieldName
from nnwatch.tensors.grad_norms import host_sum_of_squares
from nnwatch.tensors.sharded import local_of


def _fingerprint(g: torch.Tensor) -> torch.Tensor:
    flat = local_of(g).reshape(-1).float()  # a DTensor's own piece: no collective
    return torch.dot(flat, flat)


def _host_fingerprint(g: torch.Tensor) -> float:
    """The fingerprint of a gradient off the GPU, as a number: through numpy where it takes
    the gradient (a few microseconds against a torch dot's 7 on a cold cache). Taken the same
    way at both looks, so an unchanged gradient reads the same."""
    sq = host_sum_of_squares((local_of(g),))
    return sq if sq is not None else float(_fingerprint(g))


class GradChanges:
    """Owns the output-side gradient seen at the last update and the fingerprint taken when
    backward ended."""

    __slots__ = ("_after_update", "had_grad", "sentinel")

    def __init__(self) -> None:
        #: one small output-side gradient's parameter and fingerprint, when backward ended
        self.sentinel: tuple[torch.Tensor, torch.Tensor | float] | None = None
        #: the output-side parameter's gradient at the last update, and its version counter then
        self._after_update: tuple[weakref.ref[torch.Tensor], int] | None = None
        #: the output-side parameter had a gradient when this step's last backward ended
        self.had_grad = False

    def see_wiped(self, params: Sequence[torch.Tensor], buf: StepBuffers) -> None:
        """At the optimizer's step: the gradient this step's backward made is gone (a
        ``zero_grad()`` between ``backward()`` and ``step()``), so the norm the update uses is
        0. Recorded as the clipped norm (0.0, clipped), which the stall detector reads."""
        if not (self.had_grad and params and params[-1].grad is None):
            return
        host = buf.dev_np
        if host is not None:
            host[DEV_INDEX[FieldName.GRAD_NORM_CLIPPED]], host[DEV_INDEX[FieldName.CLIPPED]] = 0.0, 1.0
        else:
            buf.slot(FieldName.GRAD_NORM_CLIPPED).fill_(0.0)
            buf.slot(FieldName.CLIPPED).fill_(1.0)

    def remember(self, params: Sequence[torch.Tensor]) -> None:
        """A cheap fingerprint of one gradient, to see later whether anything changed them.

        The squared norm of a small gradient on the output side: the input side's can be all
        zero (dead units upstream), and a sum can be zero by symmetry (an output bias under
        softmax), but a rescale or a clamp changes a non-zero squared norm.
        """
        self.sentinel = None
        for p in reversed(params):
            g = p.grad
            if g is not None and local_of(g).numel() <= 65536:
                self.sentinel = (p, _fingerprint(g) if g.is_cuda else _host_fingerprint(g))
                return

    def see_cleared(self, params: Sequence[torch.Tensor], backwards: int) -> float:
        """At the update: 1.0 when the last update's gradients were not cleared before this
        one's ``backwards`` backward passes, 0.0 when they were, NaN when not observed.

        Read from the version counter of the output-side parameter's gradient (host metadata:
        no sync). ``zero_grad()`` drops the gradient (a new tensor comes) or zeroes it in place
        (one more version); every backward that adds to it is one more version. So the same
        tensor, grown by exactly the backward passes seen since the last update, was never
        cleared. Anything else (a clip or an unscale in place, a zeroing) reads as cleared: a
        fault missed, never one invented. A backward of another net through this one between its
        updates (a GAN's generator through the discriminator) counts as one of the passes.
        """
        kept = math.nan
        seen = self._after_update
        g = params[-1].grad if params else None
        if seen is not None and g is not None and backwards > 0:
            ref, version = seen
            kept = 1.0 if (g is ref() and g._version == version + backwards) else 0.0
        self._after_update = None
        if g is not None:
            try:
                self._after_update = (weakref.ref(g), g._version)
            except TypeError:  # a tensor subclass without weak references: not observed
                pass
        return kept

    def check_changed(
        self, buf: StepBuffers, norm_of_now: Callable[[], torch.Tensor | float | None]
    ) -> None:
        """Gradients measured when backward ended and changed since: record the norm the update
        uses (``norm_of_now``) as the clipped norm."""
        ref = self.sentinel
        if ref is None:
            return
        param, before = ref
        g = param.grad
        if g is None:
            return
        if isinstance(before, float):
            now = _host_fingerprint(g)
            if now == before or (math.isnan(now) and math.isnan(before)):
                return
            post = norm_of_now()
            if post is None:
                return
            buf.slot(FieldName.GRAD_NORM_CLIPPED).fill_(float(post))
            buf.slot(FieldName.CLIPPED).fill_(1.0)
            return
        post = norm_of_now()
        if post is None:
            return
        changed = _fingerprint(g) != before
        post_t = torch.as_tensor(post).to(buf.dev.device, torch.float64)
        nan = torch.full((), math.nan, device=buf.dev.device, dtype=torch.float64)
        buf.slot(FieldName.GRAD_NORM_CLIPPED).copy_(torch.where(changed, post_t, nan))
        one = torch.ones((), device=buf.dev.device, dtype=torch.float64)
        buf.slot(FieldName.CLIPPED).copy_(torch.where(changed, one, nan))
