"""nnwatch.tensors.torch_clip must match torch.nn.utils.clip_grad_norm_ bit for bit (norms and clipped grads)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from nnwatch.tensors import torch_clip as ngrad

NORM_TYPES = [2.0, 1.0, math.inf, 0.5, 3.0]
DTYPE_SETS = {
    "fp32": [torch.float32] * 4,
    "fp16": [torch.float16] * 4,
    "bf16": [torch.bfloat16] * 4,
    "mixed": [torch.float16, torch.float32, torch.bfloat16, torch.float32, torch.float16],
}


def _params(dtypes: list[torch.dtype], seed: int, scale: float = 3.0) -> list[torch.nn.Parameter]:
    """Parameters of varied shapes with random grads; big enough that clipping fires."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(17, 5), (31,), (4, 3, 3), (257,), (1,), (8, 8)]
    out = []
    for i, dt in enumerate(dtypes):
        p = torch.nn.Parameter(torch.randn(shapes[i % len(shapes)], generator=gen).to(dt))
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(dt)
        out.append(p)
    return out


def _twin(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """An independent copy, grads included (deepcopy of a Parameter drops its grad)."""
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


def _grads(params: list[torch.Tensor]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in params]


@pytest.mark.parametrize("norm_type", NORM_TYPES, ids=str)
@pytest.mark.parametrize("dtypes", list(DTYPE_SETS.values()), ids=list(DTYPE_SETS))
@pytest.mark.parametrize("foreach", [None, False, True], ids=["auto", "loop", "foreach"])
@pytest.mark.parametrize("max_norm", [1.0, 1e6], ids=["clips", "noclip"])
def test_clip_matches_torch_bitwise(norm_type, dtypes, foreach, max_norm):
    ours = _params(dtypes, seed=7)
    theirs = _twin(ours)
    raw = _grads(ours)

    n_ours = ngrad.clip_grad_norm_(ours, max_norm, norm_type, foreach=foreach)
    n_torch = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type, foreach=foreach)

    assert n_ours.dtype == n_torch.dtype
    assert torch.equal(n_ours, n_torch), (n_ours, n_torch)
    for a, b in zip(ours, theirs, strict=True):
        assert a.grad.dtype == b.grad.dtype
        assert torch.equal(a.grad, b.grad)
    if not torch.isfinite(n_torch):
        # fp16 with p=0.5 overflows (sum of sqrt|g| > 65504): the coefficient is 0, as in torch.
        assert all(float(p.grad.abs().max()) == 0.0 for p in ours)
        return
    # Norm clipping is a single positive scale: the direction is unchanged, up to the rounding
    # of the gradient dtype (bf16 keeps 8 bits, so its cosine sits ~1e-6 below 1).
    tol = max(torch.finfo(dt).eps for dt in dtypes) * 1e-2
    cos = ngrad.grad_cosine([p.grad for p in ours], raw)
    assert cos == pytest.approx(1.0, abs=tol)
    if max_norm == 1e6:
        for a, r in zip(ours, raw, strict=True):
            assert torch.equal(a.grad, r)  # coefficient clamps to exactly 1


@pytest.mark.parametrize("norm_type", NORM_TYPES, ids=str)
@pytest.mark.parametrize("dtypes", list(DTYPE_SETS.values()), ids=list(DTYPE_SETS))
def test_global_norm_and_per_param_norms(norm_type, dtypes):
    params = _params(dtypes, seed=3)
    params[1].grad = None  # a parameter without a grad is skipped, like torch does
    total, idx, norms = ngrad.param_grad_norms(params, norm_type)
    expected_total = torch.nn.utils.get_total_norm(
        [p.grad for p in params if p.grad is not None], norm_type
    )
    assert torch.equal(total, expected_total)
    assert torch.equal(ngrad.global_norm(params, norm_type), expected_total)
    assert idx == [i for i, p in enumerate(params) if p.grad is not None]
    assert 1 not in idx
    assert len(norms) == len(idx)
    for i, n in zip(idx, norms, strict=True):
        assert n.dtype == params[i].grad.dtype
        assert torch.equal(n, torch.linalg.vector_norm(params[i].grad, norm_type))


def test_per_param_norms_make_the_total():
    params = _params(DTYPE_SETS["fp32"], seed=11)
    total, _, norms = ngrad.param_grad_norms(params)
    # same value (not necessarily same bits: the order of the final sum differs)
    assert float(torch.linalg.vector_norm(torch.stack(norms))) == pytest.approx(float(total))


def test_empty_list():
    assert torch.equal(ngrad.global_norm([]), torch.nn.utils.get_total_norm([]))
    total, idx, norms = ngrad.param_grad_norms([])
    assert float(total) == 0.0 and idx == [] and norms == []
    assert torch.equal(ngrad.clip_grad_norm_([], 1.0), torch.nn.utils.clip_grad_norm_([], 1.0))


def test_empty_generator_warns_like_torch():
    with pytest.warns(UserWarning, match="empty generator"):
        n = ngrad.clip_grad_norm_((p for p in []), 1.0)
    assert float(n) == 0.0


def test_params_without_any_grad():
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    n = ngrad.clip_grad_norm_(params, 1.0)
    assert torch.equal(n, torch.nn.utils.clip_grad_norm_(_twin(params), 1.0))
    assert all(p.grad is None for p in params)


def test_single_tensor_and_generator_inputs():
    (ours,) = _params([torch.float32], seed=5)
    (theirs,) = _twin([ours])
    n_ours = ngrad.clip_grad_norm_(ours, 0.5)
    n_torch = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert torch.equal(n_ours, n_torch)
    assert torch.equal(ours.grad, theirs.grad)

    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    torch.manual_seed(0)
    model(torch.randn(5, 6)).pow(2).sum().mul(50).backward()
    twin = copy.deepcopy(model)  # deepcopy drops .grad: copy the grads across by hand
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        b.grad = a.grad.clone()
    assert torch.equal(
        ngrad.clip_grad_norm_(model.parameters(), 1.0),
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0),
    )
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_building_blocks_compose_to_clip():
    ours = _params(DTYPE_SETS["mixed"], seed=9)
    theirs = _twin(ours)
    total, _, _ = ngrad.param_grad_norms(ours)
    ngrad.clip_grads_with_norm_(ours, 0.25, total)
    n_torch = torch.nn.utils.clip_grad_norm_(theirs, 0.25)
    assert torch.equal(total, n_torch)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)
    assert float(ngrad.global_norm(ours)) == pytest.approx(0.25, rel=1e-2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_error_if_nonfinite(bad):
    params = _params(DTYPE_SETS["fp32"], seed=1)
    params[2].grad[0, 0, 0] = bad
    before = _grads(params)
    with pytest.raises(RuntimeError, match="non-finite"):
        ngrad.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError):
        torch.nn.utils.clip_grad_norm_(_twin(params), 1.0, error_if_nonfinite=True)
    for p, b in zip(params, before, strict=True):
        assert torch.allclose(p.grad, b, rtol=0, atol=0, equal_nan=True)  # untouched on error
    # Without the flag, torch scales by the non-finite norm anyway; so do we, bit for bit.
    ours, theirs = _twin(params), _twin(params)
    n1 = ngrad.clip_grad_norm_(ours, 1.0)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert torch.equal(n1, n2) or (n1.isnan().item() and n2.isnan().item())
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a.grad, b.grad, equal_nan=True, rtol=0, atol=0)


def test_foreach_true_on_unsupported_device_raises():
    p = torch.nn.Parameter(torch.ones(3, device="meta"))
    p.grad = torch.ones(3, device="meta")
    with pytest.raises(RuntimeError, match="foreach=True"):
        ngrad.param_grad_norms([p], foreach=True)


def test_clip_under_autograd_context_does_not_record():
    p = torch.nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4, requires_grad=False) * 10
    with torch.enable_grad():
        n = ngrad.clip_grad_norm_([p], 1.0)
    assert not n.requires_grad


def test_value_clamp_bends_direction_but_norm_clip_does_not():
    params = _params(DTYPE_SETS["fp32"], seed=2)
    raw = _grads(params)
    clamped = _twin(params)
    torch.nn.utils.clip_grad_value_(clamped, 0.5)
    assert ngrad.grad_cosine([p.grad for p in clamped], raw) < 0.99
    ngrad.clip_grad_norm_(params, 0.5)
    assert ngrad.grad_cosine([p.grad for p in params], raw) == pytest.approx(1.0, abs=1e-6)


def test_grad_cosine_edge_cases():
    z = [torch.zeros(3)]
    assert ngrad.grad_cosine(z, z) == 1.0
    assert ngrad.grad_cosine(z, [torch.ones(3)]) == 0.0
    assert ngrad.grad_cosine([torch.ones(3)], [-torch.ones(3)]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        ngrad.grad_cosine([torch.ones(3)], [torch.ones(4)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("norm_type", NORM_TYPES, ids=str)
def test_cuda_and_cross_device_bitwise(norm_type):
    cpu = _params(DTYPE_SETS["mixed"], seed=4)
    ours = []
    for i, p in enumerate(cpu):  # alternate devices: grouping must handle both
        q = torch.nn.Parameter(p.detach().clone().cuda() if i % 2 == 0 else p.detach().clone())
        q.grad = p.grad.cuda() if i % 2 == 0 else p.grad.clone()  # deepcopy leaves .grad behind
        ours.append(q)
    theirs = _twin(ours)
    n1 = ngrad.clip_grad_norm_(ours, 1.0, norm_type)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    assert n1.device == n2.device and torch.equal(n1, n2)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)
