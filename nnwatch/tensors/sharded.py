"""Gradient and weight norms of sharded parameters (DTensor: FSDP2, tensor parallel), as whole
parameters.

A DTensor holds one piece of a parameter on each rank of its device mesh: a ``Shard`` placement
splits it along a mesh dimension, a ``Replicate`` one copies it, a ``Partial`` one leaves it as
a sum still to be taken. The norm a user compares is the whole parameter's (what torch's
``clip_grad_norm_`` returns, with ``full_tensor()``), so each rank contributes the sum of squares
of its own piece, counted once per replica: a rank whose coordinate along every ``Replicate``
dimension is 0 contributes it, the others contribute 0. A sum over the whole mesh is then the
whole parameter's. A ``Partial`` piece is summed first (its squares do not add up), by
:func:`resolve_partial`. Nothing here issues a collective but that one; the sums themselves are
reduced by :mod:`nnwatch.probe.sharded_reduce`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

try:  # torch >= 2.4 has the public module; the probe works without it (no DTensor then)
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - very old torch or no distributed build
    DTensor = None  # type: ignore[assignment,misc]


class UnsupportedLayout(Exception):
    """A sharded parameter whose whole norm nnwatch cannot take (said once, in plain words)."""


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor (a piece of a parameter sharded over a device mesh)."""
    return DTensor is not None and isinstance(t, DTensor)


def any_sharded(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor."""
    return DTensor is not None and any(isinstance(t, DTensor) for t in tensors)


def local_of(t: torch.Tensor) -> torch.Tensor:
    """This rank's own elements of ``t`` as a plain tensor (``t`` itself when it is not a
    DTensor), detached: what can be read without a collective."""
    if DTensor is not None and isinstance(t, DTensor):
        # the local tensor itself: ``to_local()`` is an autograd function, tens of microseconds
        # a call, where nothing here needs a graph
        local = getattr(t, "_local_tensor", None)
        return (local if isinstance(local, torch.Tensor) else t.to_local()).detach()
    return t.detach()


def mesh_key(t: torch.Tensor) -> tuple[Any, ...] | None:
    """The device mesh ``t`` lives on, as a hashable key (None for a plain tensor). Ranks of
    other sub-meshes (the data-parallel rows of a 2-D mesh) have other keys in the same places,
    so buckets made in the parameters' order line up on every rank."""
    if not is_dtensor(t):
        return None
    mesh = t.device_mesh  # type: ignore[attr-defined]
    return (tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()), mesh.mesh_dim_names)


def counted_here(t: torch.Tensor, partial_as_replica: bool = False) -> bool:
    """Whether this rank's piece of ``t`` counts in the whole parameter's sum of squares: once
    per replica, so only where the coordinate along every ``Replicate`` dimension is 0 (and
    along every ``Partial`` one, with ``partial_as_replica``, once its pieces are summed)."""
    if not is_dtensor(t):
        return True
    coord = t.device_mesh.get_coordinate()  # type: ignore[attr-defined]
    if coord is None:
        return False  # not on this mesh at all
    for dim, p in enumerate(t.placements):  # type: ignore[attr-defined]
        if (p.is_replicate() or (partial_as_replica and p.is_partial())) and coord[dim] != 0:
            return False
    return True


def has_partial(t: torch.Tensor) -> bool:
    """Whether a DTensor still holds a sum to be taken (a ``Partial`` placement)."""
    return is_dtensor(t) and any(p.is_partial() for p in t.placements)  # type: ignore[attr-defined]


def resolve_partial(t: torch.Tensor) -> tuple[torch.Tensor, list[Any]]:
    """Start summing a ``Partial`` gradient's pieces: a copy of the local piece and the async
    all-reduce works (one per ``Partial`` mesh dimension, on that dimension's group), in mesh
    order, the same on every rank. The copy holds the sum once the works are waited. Raises
    :class:`UnsupportedLayout` for a reduction other than a sum or a mean."""
    import torch.distributed as dist

    mesh = t.device_mesh  # type: ignore[attr-defined]
    local = t.to_local().detach().clone()  # type: ignore[attr-defined]
    works: list[Any] = []
    for dim, p in enumerate(t.placements):  # type: ignore[attr-defined]
        if not p.is_partial():
            continue
        op = str(getattr(p, "reduce_op", "sum"))
        if op not in ("sum", "avg"):
            raise UnsupportedLayout(f"a Partial({op}) gradient")
        if works:  # a second Partial dimension sums the first one's result (rare: waited)
            finish_partial(local, works)
            works = []
        group = mesh.get_group(dim)
        works.append(dist.all_reduce(local, group=group, async_op=True))
        if op == "avg":  # summed, then divided once the work is waited (see finish_partial)
            works.append(("avg", dist.get_world_size(group)))
    return local, works


def finish_partial(local: torch.Tensor, works: list[Any]) -> torch.Tensor:
    """The summed piece of :func:`resolve_partial`, once its works are done."""
    _wait(works)
    for w in works:
        if isinstance(w, tuple):
            local.div_(w[1])
    return local


def _wait(works: list[Any]) -> None:
    for w in works:
        if not isinstance(w, tuple):
            w.wait()


def local_squares(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each tensor's local sum of squares (float64, on the first one's device), plain tensors and
    DTensor pieces alike: one fused norm over the local pieces, squared in float64 (the norm of a
    float32 tensor of finite elements overflows only past 3e38), no host read."""
    locals_ = [_dense(local_of(t)) for t in tensors]
    if not locals_:
        return torch.zeros(0, dtype=torch.float64)
    dev = locals_[0].device
    try:
        norms = list(torch._foreach_norm(locals_, 2.0))
    except (RuntimeError, TypeError, NotImplementedError):
        norms = [torch.linalg.vector_norm(x, 2.0) for x in locals_]
    return torch.stack([n.to(dev, torch.float64) for n in norms]).square_()


def _dense(x: torch.Tensor) -> torch.Tensor:
    """A sparse gradient's stored values (the same L2 norm); a dense one as it is."""
    if x.layout == torch.strided:
        return x
    return x.coalesce().values() if x.layout == torch.sparse_coo else x.values()
