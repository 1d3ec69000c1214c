"""Cross-checks against PyTorch's own quantization operators where the semantics coincide, and a
demonstration (not a loosened check) of each place where they do not.

xquant (SPEC section 1): scale = max_bound / amax; out = clamp(rint(x * scale), min_bound, max_bound) / scale
PyTorch fake_quantize_*: inv_scale = 1 / s; q = clamp(rint(x * inv_scale) + zp, qmin, qmax); out = (q - zp) * s
With s = 1 / scale a power of two both are exact and agree, with one systematic exception: the sign of
zero. PyTorch adds the zero point as a float (0 + rint(x * inv_scale)), which turns a -0 level into +0;
xquant computes rint(x * scale) / scale, so a negative x that rounds to level 0 gives -0 (the sign NumPy's
and C's rint keep). Those positions are identified exactly and checked separately, everything else is
compared bit for bit. Otherwise (scale not a power of two) PyTorch's reciprocal and its final
multiplication round differently from xquant's division on some inputs (demonstrated below).
"""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np
import torch

import golden
import xquant
from golden import assert_same
from tutil import to_numpy


def _bounds(num_bits, is_unsigned, narrow_range):
    lo, hi = golden.fake_quant_bounds(num_bits, is_unsigned, narrow_range)
    return int(lo), int(hi)


def assert_same_but_zero_sign(ours: torch.Tensor, theirs: torch.Tensor, x: torch.Tensor, scale) -> None:
    """Bit-exact, except that where x * scale rounds to -0 (x <= 0, |x * scale| <= 0.5) xquant has -0 and
    PyTorch +0 (see the module docstring)."""
    level = torch.round(x * scale)  # torch.round is half-to-even, like rint
    neg_zero = (level == 0) & torch.signbit(level)
    assert torch.all(torch.signbit(ours[neg_zero])) and torch.all(ours[neg_zero] == 0)
    assert not torch.any(torch.signbit(theirs[neg_zero])) and torch.all(theirs[neg_zero] == 0)
    assert_same(to_numpy(ours[~neg_zero]), to_numpy(theirs[~neg_zero]))


def _data(seed, shape, spread):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * spread
    x.view(-1)[:8] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e6, -1e6, 3.0, -3.0])  # zero, tiny, clipped
    return x


@pytest.mark.parametrize("num_bits", [2, 4, 8, 12, 16])
@pytest.mark.parametrize("is_unsigned,narrow_range", [(False, True), (False, False), (True, True)])
@pytest.mark.parametrize("k", [-3, 0, 4])
def test_fake_quantize_per_tensor_affine_power_of_two_scale(num_bits, is_unsigned, narrow_range, k):
    lo, hi = _bounds(num_bits, is_unsigned, narrow_range)
    scale = 2.0 ** k                    # xquant's scale (a multiplier); PyTorch's scale is 1 / scale
    amax = torch.tensor([hi / scale])   # max_bound / 2^k: exact in float32, so scale = max_bound / amax = 2^k
    x = _data(num_bits * 10 + k, (64, 33), spread=(hi / scale) * 0.7)
    # ties: x * scale = m + 0.5 exactly, both signs
    x.view(-1)[8:28] = (torch.arange(-10, 10, dtype=torch.float32) + 0.5) / scale
    ours = xquant.npu_fake_tensor_quant(x, amax, num_bits, is_unsigned, narrow_range)
    theirs = torch.fake_quantize_per_tensor_affine(x, 1.0 / scale, 0, lo, hi)
    assert_same_but_zero_sign(ours, theirs, x, scale)


@pytest.mark.parametrize("num_bits,narrow_range", [(8, True), (8, False), (4, True)])
def test_fake_quantize_per_channel_affine_power_of_two_scales(num_bits, narrow_range):
    lo, hi = _bounds(num_bits, False, narrow_range)
    scales = torch.tensor([2.0 ** k for k in (-2, 0, 3, 5, 1, -4)], dtype=torch.float32)
    amax = hi / scales  # exact
    x = _data(7, (6, 4, 10), spread=4.0)
    x[:, 0, :3] = torch.tensor([0.5, 1.5, -2.5]).view(1, 3) / scales.view(6, 1)  # ties per channel
    ours = xquant.npu_fake_tensor_quant_with_axis(x, amax, 0, num_bits, False, narrow_range)
    theirs = torch.fake_quantize_per_channel_affine(x, 1.0 / scales, torch.zeros(6, dtype=torch.int32), 0, lo, hi)
    assert_same_but_zero_sign(ours, theirs, x, scales.view(6, 1, 1))
    # the same along the last axis
    xt = x.transpose(0, 2).contiguous()
    ours = xquant.npu_fake_tensor_quant_with_axis(xt, amax, -1, num_bits, False, narrow_range)
    theirs = torch.fake_quantize_per_channel_affine(xt, 1.0 / scales, torch.zeros(6, dtype=torch.int32), 2, lo, hi)
    assert_same_but_zero_sign(ours, theirs, xt, scales)


def test_fake_quantize_mismatch_when_scale_is_not_a_power_of_two():
    """amax = 1, 8 bits: scale = 127. xquant divides by 127; PyTorch multiplies by the float32 1/127 twice
    (x * (1 / (1/127)) and q * (1/127)). On some inputs the results differ: xquant matches its golden, which
    follows SPEC's division, and PyTorch does not."""
    amax = torch.tensor([1.0])
    x = torch.linspace(-1.2, 1.2, 20001)
    ours = xquant.npu_fake_tensor_quant(x, amax)
    theirs = torch.fake_quantize_per_tensor_affine(x, 1.0 / 127.0, 0, -127, 127)
    assert_same(to_numpy(ours), golden.fake_quant(x.numpy(), amax.numpy()))
    differ = ours != theirs
    assert differ.any(), "expected the reciprocal-multiply rounding difference on this data"
    # Where they differ, both are q / 127 for the same integer q, one rounding apart.
    q = torch.round(ours[differ] * 127)
    assert torch.equal(q, torch.round(theirs[differ] * 127))
    assert torch.all((ours[differ] - theirs[differ]).abs() <= torch.finfo(torch.float32).eps * q.abs())


def test_ste_gradient_matches_pytorch_away_from_the_clip_edges():
    lo, hi = -127, 127
    scale = 16.0
    amax = torch.tensor([hi / scale])
    x = torch.linspace(-12, 12, 4001)
    edge = hi / scale
    x = x[(x.abs() < edge - 0.5 / scale) | (x.abs() > edge + 0.5 / scale)]  # outside the half-step band
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    g = torch.randn(x.shape)
    xquant.npu_fake_tensor_quant(a, amax).backward(g)
    torch.fake_quantize_per_tensor_affine(b, 1.0 / scale, 0, lo, hi).backward(g)
    assert torch.equal(a.grad, b.grad)
    # per channel
    amax_c = torch.tensor([127 / 4.0, 127 / 8.0])
    xc = torch.tensor([[-40.0, -31.0, 0.3, 31.0, 40.0], [-20.0, -15.0, 0.3, 15.0, 20.0]])
    a = xc.clone().requires_grad_()
    b = xc.clone().requires_grad_()
    xquant.npu_fake_tensor_quant_with_axis(a, amax_c, 0).sum().backward()
    torch.fake_quantize_per_channel_affine(b, 1 / torch.tensor([4.0, 8.0]), torch.zeros(2, dtype=torch.int32), 0,
                                           lo, hi).sum().backward()
    assert torch.equal(a.grad, b.grad)


def test_ste_gradient_mismatch_inside_the_half_step_band():
    """x just above max_bound / scale still rounds to max_bound: PyTorch's mask is on the rounded value
    (gradient 1), SPEC's window is on x itself, [min_bound / scale, max_bound / scale] (gradient 0, as
    NVIDIA's pytorch-quantization clips)."""
    scale = 16.0
    amax = torch.tensor([127 / scale])
    x = torch.tensor([127.25 / scale, -127.25 / scale], requires_grad=True)
    y = torch.tensor([127.25 / scale, -127.25 / scale], requires_grad=True)
    xquant.npu_fake_tensor_quant(x, amax).sum().backward()
    torch.fake_quantize_per_tensor_affine(y, 1.0 / scale, 0, -127, 127).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0]
    assert y.grad.tolist() == [1.0, 1.0]


# PyTorch deprecates its quantized tensor creation functions (a warning); they remain the reference here.
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("qdtype,zp_range", [(torch.qint8, (-20, 20)), (torch.quint8, (0, 60)),
                                             (torch.qint32, (-1000, 1000))])
def test_quantize_per_channel_int_repr(qdtype, zp_range):
    scales = torch.tensor([0.25, 2.0, 0.5, 1.0, 0.125], dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    zp = torch.randint(zp_range[0], zp_range[1], (5,), generator=g)
    spread = 1e5 if qdtype == torch.qint32 else 40.0
    x = torch.randn(3, 5, 7, generator=g) * spread
    x[0, :, 0] = 1e9   # saturates high
    x[0, :, 1] = -1e9  # saturates low
    # No ties (x / s an exact half-integer): PyTorch rounds before adding the zero point (see below).
    x = torch.where((x / scales.view(1, 5, 1)).frac().abs() == 0.5, x + 0.01, x)
    zp_dtype = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}[qdtype]
    ours = xquant.npu_quantize(x, scales, zp.to(zp_dtype), qdtype, axis=1, div_mode=True)
    theirs = torch.quantize_per_channel(x, scales.double(), zp, 1, qdtype).int_repr()
    assert ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantize_tie_with_odd_zero_point_differs_from_pytorch():
    """SPEC: y = rint(x / s + zero_point) (the zero point is added before the one rounding, as the Ascend
    kernel does). PyTorch computes zero_point + rint(x / s). With an odd zero point a tie rounds to the other
    neighbour: 0.5 / 1 + 1 = 1.5 -> 2 here, 1 + rint(0.5) = 1 in PyTorch."""
    x = torch.tensor([[0.5, 2.5, -0.5, 0.25]])
    ours = xquant.npu_quantize(x, torch.tensor([1.0]), torch.tensor([1], dtype=torch.int8), torch.qint8)
    theirs = torch.quantize_per_channel(x, torch.tensor([1.0], dtype=torch.float64), torch.tensor([1]), 0,
                                        torch.qint8).int_repr()
    assert ours.tolist() == [[2, 4, 0, 1]]     # rint(1.5), rint(3.5), rint(0.5), rint(1.25)
    assert theirs.tolist() == [[1, 3, 1, 1]]   # 1 + rint(0.5), 1 + rint(2.5), 1 + rint(-0.5), 1 + rint(0.25)
    # Golden follows SPEC.
    assert_same(ours.numpy(), golden.quantize(x.numpy(), np.array([1.0], np.float32), np.array([1], np.int8),
                                              "qint8", 1, True))
