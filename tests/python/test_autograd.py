"""Autograd of the torch integration: hand-derived gradients, torch.autograd.gradcheck where the function is
smooth (the saturated regions, where the SPEC gradients are the true derivatives), and the autograd path
against the backward functions and the NumPy goldens."""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import warnings

import numpy as np
import torch

import golden
import xquant
from golden import assert_same
from tutil import to_numpy

F = np.float32


# ---- fake tensor quant ------------------------------------------------------------------------------------

def test_fake_quant_ste_and_amax_grad_by_hand():
    # amax = 1, 8 bits, narrow: scale = 127, window [min_bound / scale, max_bound / scale] = [-1, 1].
    x = torch.tensor([-3.0, -1.0, 0.3, 0.99, 1.0, 2.0], requires_grad=True)
    amax = torch.tensor(1.0, requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    xquant.npu_fake_tensor_quant(x, amax).backward(g)
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 0.0]  # straight through inside the window
    # grad_amax = sum(g * (x > 1 ? 1 : x < -1 ? min_bound / max_bound : 0)) = 6 * 1 + 1 * (-127 / 127)
    assert amax.grad.item() == 5.0 and amax.grad.shape == ()

    # wide range: min_bound = -128, window [-128/127, 1], ratio -128/127
    x.grad = None
    amax.grad = None
    xquant.npu_fake_tensor_quant(x, amax, narrow_range=False).backward(g)
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 0.0]
    assert amax.grad.item() == float(F(6.0) + F(1.0) * (F(-128) / F(127)))

    # unsigned (SPEC 1: the lower bound stays negative): bound 255, scale 255, window [-255/255, 1] = [-1, 1],
    # ratio -255/255 = -1: the same gradients as narrow signed
    x.grad = None
    amax.grad = None
    xquant.npu_fake_tensor_quant(x, amax, is_unsigned=True).backward(g)
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 0.0]
    assert amax.grad.item() == 5.0
    # unsigned wide: min_bound -256, window [-256/255, 1], ratio -256/255
    x.grad = None
    amax.grad = None
    xquant.npu_fake_tensor_quant(x, amax, is_unsigned=True, narrow_range=False).backward(g)
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 0.0]
    assert amax.grad.item() == float(F(6.0) + F(1.0) * (F(-256) / F(255)))


def test_fake_quant_amax_without_grad():
    x = torch.randn(10, requires_grad=True)
    amax = torch.tensor([1.0])
    xquant.npu_fake_tensor_quant(x, amax).sum().backward()
    assert amax.grad is None
    assert torch.equal(x.grad, ((x >= -1) & (x <= 1)).float())


def test_fake_quant_per_axis_grads_by_hand():
    # channel 0: amax 1 (window [-1, 1]); channel 1: amax 2 (window [-2, 2])
    x = torch.tensor([[-1.5, 0.5, 1.5], [-2.5, 0.5, 2.5]], requires_grad=True)
    amax = torch.tensor([1.0, 2.0], requires_grad=True)
    g = torch.tensor([[1.0, 10.0, 100.0], [1000.0, 10000.0, 100000.0]])
    xquant.npu_fake_tensor_quant_with_axis(x, amax, 0).backward(g)
    assert x.grad.tolist() == [[0.0, 10.0, 0.0], [0.0, 10000.0, 0.0]]
    assert amax.grad.tolist() == [100.0 - 1.0, 100000.0 - 1000.0]
    # the same along axis 1 (transposed data), amax reduced per column
    xt = x.detach().t().contiguous().requires_grad_()
    amax.grad = None
    xquant.npu_fake_tensor_quant_with_axis(xt, amax, 1).backward(g.t())
    assert amax.grad.tolist() == [99.0, 99000.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("axis", [None, 1])
def test_fake_quant_autograd_equals_backward_kernel_and_golden(dtype, axis):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(16, 12, 5, generator=gen) * 3).to(dtype)
    amax = (torch.rand(1 if axis is None else 12, generator=gen) * 3 + 0.1).to(dtype)
    g = torch.randn(x.shape, generator=gen).to(dtype)
    xa, aa = x.clone().requires_grad_(), amax.clone().requires_grad_()
    if axis is None:
        y = xquant.npu_fake_tensor_quant(xa, aa, num_bits=5)
    else:
        y = xquant.npu_fake_tensor_quant_with_axis(xa, aa, axis, num_bits=5)
    y.backward(g)
    assert xa.grad.dtype == dtype and aa.grad.dtype == dtype
    gi, ga = xquant.fake_tensor_quant_backward(g, x, amax, axis, num_bits=5)
    assert torch.equal(xa.grad, gi) and torch.equal(aa.grad, ga)
    wi, wa = golden.fake_quant_backward(to_numpy(g), to_numpy(x), to_numpy(amax), axis, 5)
    assert_same(to_numpy(xa.grad), wi)
    assert_same(to_numpy(aa.grad), wa)


def _gradcheck(fn, inputs, **kw):
    # float32 inputs (the kernels compute in float32): finite differences with eps 1e-2 have an error far
    # below the tolerance where the function is linear, as in the saturated regions used here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*double precision.*")
        return torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-3, rtol=2e-3, **kw)


def test_fake_quant_gradcheck_amax_in_saturated_region():
    """Where |x| > amax, out = +-max_bound / scale = +-amax (times min_bound / max_bound below): smooth in
    amax with derivative 1 (or min_bound / max_bound), and constant in x; the learnable-amax gradient is the
    true derivative there."""
    gen = torch.Generator().manual_seed(2)
    sign = torch.where(torch.rand(20, generator=gen) < 0.5, -1.0, 1.0)
    x = (sign * (3.0 + torch.rand(20, generator=gen))).requires_grad_()
    for narrow in (True, False):
        amax = torch.tensor([2.0], requires_grad=True)
        assert _gradcheck(lambda xx, a: xquant.npu_fake_tensor_quant(xx, a, 8, False, narrow), (x, amax))
    amax_c = torch.tensor([2.0, 1.5, 2.5, 1.0], requires_grad=True)
    assert _gradcheck(lambda xx, a: xquant.npu_fake_tensor_quant_with_axis(xx, a, 0), (x.view(4, 5), amax_c))


# ---- ActsULQ ---------------------------------------------------------------------------------------------------

def test_acts_ulq_grads_by_hand():
    # clamp_min = 0, clamp_max = 255: s = 1, off = 0, clip range [0, 255]; y_grad = 1 everywhere.
    x = torch.tensor([-3.0, 0.5, 1.5, 2.4, 254.6, 300.0], requires_grad=True)
    cmin = torch.tensor([0.0], requires_grad=True)
    cmax = torch.tensor([255.0], requires_grad=True)
    y, m0, m1, loss = xquant.acts_ulq(x, cmin, cmax)
    assert not (m0.requires_grad or m1.requires_grad or loss.requires_grad)  # only y is differentiable
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]  # min_mask * max_mask
    inner = loss.detach().numpy()[1:5].astype(np.float64)  # the in-range losses; loss_m = 0 here
    # clamp_min_grad = sum((1 - min_mask) - loss): 1 from x = -3, -loss for the in-range elements
    assert cmin.grad.item() == float(F(1.0 - inner.sum()))
    # clamp_max_grad = sum(loss + (1 - max_mask)): loss for the in-range elements, 1 from x = 300
    assert cmax.grad.item() == float(F(1.0 + inner.sum()))


def test_acts_ulq_zeroed_clamp_grads():
    x = torch.linspace(-2, 2, 9, requires_grad=True)
    cmin = torch.tensor([0.5], requires_grad=True)      # > 0: gradient 0
    cmax = torch.tensor([1e-6], requires_grad=True)     # < LEVELS * EPS: gradient 0
    xquant.acts_ulq(x, cmin, cmax)[0].sum().backward()
    assert cmin.grad.item() == 0.0 and cmax.grad.item() == 0.0
    cmin2 = torch.tensor([-1.0], requires_grad=True)    # fixed_min: gradient 0
    xquant.acts_ulq(x.detach(), cmin2, torch.tensor([1.0]), fixed_min=True)[0].sum().backward()
    assert cmin2.grad.item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (3, 1), (2, 1, 4)), ((5,), (3, 1), ()), ((4, 6), (1,), (1,))])
def test_acts_ulq_autograd_broadcast_reduction(dtype, shapes):
    xs, ls, hs = shapes
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(xs, generator=gen) * 2).to(dtype).requires_grad_()
    cmin = (torch.randn(ls, generator=gen) - 0.5).to(dtype).requires_grad_()
    cmax = (torch.rand(hs, generator=gen) + 0.5).to(dtype).requires_grad_()
    y, m0, m1, loss = xquant.acts_ulq(x, cmin, cmax)
    dy = torch.randn(y.shape, generator=gen).to(dtype)
    y.backward(dy)
    assert x.grad.shape == x.shape and cmin.grad.shape == cmin.shape and cmax.grad.shape == cmax.shape
    want = golden.acts_ulq_backward(to_numpy(dy), xs, to_numpy(cmin), to_numpy(cmax), to_numpy(m0), to_numpy(m1),
                                    to_numpy(loss))
    for got, w in zip((x.grad, cmin.grad, cmax.grad), want):
        assert_same(to_numpy(got), w)


def test_acts_ulq_gradcheck_in_saturated_region():
    """With clamp_min > 0 (ori_min = 0, offset 0) and every x outside [0, clamp_max]: y = LEVELS * s =
    clamp_max above the range and 0 below, so dy/dclamp_max = 1 (above) or 0 (below), dy/dx = 0 and
    dy/dclamp_min = 0: exactly the SPEC gradients (loss_m = 0 there). Checked with broadcast clamps."""
    gen = torch.Generator().manual_seed(6)
    above = 3.0 + torch.rand(3, 2, generator=gen)
    below = -1.0 - torch.rand(3, 2, generator=gen)
    x = torch.cat([above, below], dim=1).requires_grad_()          # [3, 4]
    cmin = torch.tensor([[0.25], [0.5], [0.75]], requires_grad=True)  # [3, 1], > 0
    cmax = torch.tensor([1.5, 2.0, 1.0, 2.5], requires_grad=True)   # [4]
    assert _gradcheck(lambda a, b, c: xquant.acts_ulq(a, b, c)[0], (x, cmin, cmax))
    assert _gradcheck(lambda a, b, c: xquant.acts_ulq(a, b, c, fixed_min=True)[0], (x, cmin, cmax))


def test_acts_ulq_learnable_clamp_moves_toward_data():
    """A few SGD steps on clamp_max with every activation above it: the gradient is +1 per element
    (dL/dy = 1 for L = sum(y)), so minimising -sum(y) grows clamp_max."""
    x = torch.full((32,), 5.0)
    cmax = torch.tensor([1.0], requires_grad=True)
    opt = torch.optim.SGD([cmax], lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        (-xquant.acts_ulq(x, torch.tensor([0.0]), cmax)[0].sum()).backward()
        opt.step()
    assert abs(cmax.item() - (1.0 + 5 * 0.01 * 32)) < 1e-5
