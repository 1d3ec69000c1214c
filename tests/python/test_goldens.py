"""Every operator against the independent NumPy goldens of SPEC.md, exactly (bit for bit), on random and
edge inputs, float32 / float16 / bfloat16, from NumPy and from torch. Without torch (the torch-free run,
scripts/test-python-numpy) the NumPy halves run and the torch-only tests skip, saying so."""

import pytest

pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np

import golden
import xquant
from golden import assert_same
from tutil import NP_DTYPES, random_floats, to_numpy, to_torch, torch, with_edges

DT_IDS = ["f32", "f16", "bf16"]


def run_both(fn, *arrays, **kw):
    """fn on NumPy arrays and on torch tensors with the same bits; returns both results as NumPy (the
    two must agree bit for bit)."""
    np_out = fn(*arrays, **kw)
    if torch is None:  # the torch-free run: NumPy against the goldens only
        return np_out
    conv = lambda a: to_torch(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    t_out = fn(*(conv(a) for a in arrays), **{k: conv(v) for k, v in kw.items()})
    if isinstance(np_out, tuple):
        t_np = tuple(to_numpy(t) for t in t_out)
        for a, b in zip(np_out, t_np):
            assert_same(a, b, "numpy vs torch")
        return np_out
    assert isinstance(t_out, torch.Tensor)
    assert_same(np_out, to_numpy(t_out), "numpy vs torch")
    return np_out


# ---- 1. fake tensor quant ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("num_bits", [1, 2, 4, 8, 16, 31, 32])
@pytest.mark.parametrize("is_unsigned", [False, True])
@pytest.mark.parametrize("narrow_range", [True, False])
def test_fake_quant_per_tensor(rng, dtype, num_bits, is_unsigned, narrow_range):
    x = with_edges(rng, 777, dtype)
    for amax_value in (2.5, 1.0, 1e-3, 3e4):
        amax = np.array([amax_value], dtype=dtype)
        got = run_both(xquant.npu_fake_tensor_quant, x, amax, num_bits=num_bits, is_unsigned=is_unsigned,
                       narrow_range=narrow_range)
        want = golden.fake_quant(x, amax, None, num_bits, is_unsigned, narrow_range)
        assert_same(got, want, f"amax={amax_value}")


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_fake_quant_degenerate_amax(rng, dtype):
    """amax == 0 (scale = Inf), a subnormal amax (scale overflows), num_bits = 1 signed (scale = 0):
    the output is 0, NaN stays NaN."""
    x = with_edges(rng, 300, dtype)
    tiny = 2.0 ** -24 if np.dtype(dtype) == np.float16 else 1e-45  # float16 inputs need a float16-exact amax
    for amax_value, nb in ((0.0, 8), (tiny, 8), (2.0, 1), (0.0, 1)):
        amax = np.array(amax_value, dtype=np.float32)  # 0-d amax
        got = run_both(xquant.npu_fake_tensor_quant, x, amax, num_bits=nb)
        assert_same(got, golden.fake_quant(x, amax, None, nb), f"amax={amax_value} num_bits={nb}")
        x32 = x.astype(np.float32)
        assert np.array_equal(np.isnan(got.astype(np.float32)), np.isnan(x32))
        assert np.all(got.astype(np.float32)[~np.isnan(x32)] == 0)


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("shape,axis", [((5, 7, 3), 0), ((5, 7, 3), 1), ((5, 7, 3), 2), ((5, 7, 3), -1),
                                        ((4, 9), -2), ((11,), 0), ((2, 3, 4, 5), 2)])
def test_fake_quant_per_axis(rng, dtype, shape, axis):
    x = with_edges(rng, int(np.prod(shape)), dtype).reshape(shape)
    c = shape[axis]
    amax = (np.abs(rng.standard_normal(c)) * 3).astype(np.float32).astype(dtype)
    amax[0] = 0  # one degenerate channel
    for nb, uns, nar in ((8, False, True), (4, True, True), (3, False, False)):
        got = run_both(xquant.npu_fake_tensor_quant_with_axis, x, amax, axis, num_bits=nb, is_unsigned=uns,
                       narrow_range=nar)
        assert_same(got, golden.fake_quant(x, amax, axis, nb, uns, nar), f"axis={axis} nb={nb}")


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_fake_quant_ties_round_half_even(dtype):
    """x * scale exactly k + 0.5: SPEC rule 1 (rint, not floor(x + 0.5))."""
    amax = np.array([127 / 16], dtype=np.float32)  # scale = 127 / (127 / 16) = 16 exactly
    k = np.arange(-10, 10, dtype=np.float32)
    x = ((k + 0.5) / 16).astype(dtype)
    got = xquant.npu_fake_tensor_quant(x, amax)
    want_levels = np.rint(k + 0.5)  # ..., -1.5 -> -2, -0.5 -> -0, 0.5 -> 0, 1.5 -> 2, ...
    assert np.array_equal(got.astype(np.float32) * 16, want_levels)
    assert_same(got, golden.fake_quant(x, amax))


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_fake_quant_inplace_matches_out_of_place(rng, dtype):
    x = with_edges(rng, 513, dtype).reshape(27, 19)
    amax = np.array([2.0], dtype=dtype)
    want = golden.fake_quant(x, amax, None, 6, False, False)
    xn = x.copy()
    assert xquant.npu_fake_tensor_quant_inplace(xn, amax, num_bits=6, narrow_range=False) is xn
    assert_same(xn, want)
    if torch is not None:
        xt = to_torch(x)
        assert xquant.npu_fake_tensor_quant_inplace(xt, to_torch(amax), num_bits=6, narrow_range=False) is xt
        assert_same(to_numpy(xt), want)


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_fake_quant_backward_golden(rng, dtype, axis):
    x = with_edges(rng, 40 * 33, dtype, scale=4.0).reshape(40, 33)
    g = random_floats(rng, x.shape, dtype, scale=1.0)
    amax = np.array([2.0], dtype=dtype) if axis is None else (
        np.abs(rng.standard_normal(x.shape[axis]) * 3).astype(np.float32).astype(dtype))
    for nb, uns, nar in ((8, False, True), (8, False, False), (4, True, True), (1, False, True)):
        gi, ga = run_both(xquant.fake_tensor_quant_backward, g, x, amax, axis, num_bits=nb, is_unsigned=uns,
                          narrow_range=nar)
        wi, wa = golden.fake_quant_backward(g, x, amax, axis, nb, uns, nar)
        assert_same(gi, wi, "grad_inputs")
        assert_same(ga, wa, "grad_amax")


def test_fake_quant_backward_long_sum_blocking(rng):
    """grad_amax over more than one 1024-term chunk: the canonical blocked sum of SPEC rule 5."""
    x = (rng.standard_normal(5000) * 4).astype(np.float32)
    g = rng.standard_normal(5000).astype(np.float32)
    amax = np.array([1.5], dtype=np.float32)
    gi, ga = xquant.fake_tensor_quant_backward(g, x, amax)
    wi, wa = golden.fake_quant_backward(g, x, amax)
    assert_same(gi, wi), assert_same(ga, wa)


# ---- 2. npu_quantize ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("qdtype", ["qint8", "quint8", "qint32"])
@pytest.mark.parametrize("zp_dtype", [None, np.int8, np.uint8, np.int32, np.float32])
def test_quantize_div_mode(rng, dtype, qdtype, zp_dtype):
    x = with_edges(rng, 6 * 5 * 4, dtype, scale=100.0).reshape(6, 5, 4)
    if qdtype == "qint32":
        with np.errstate(over="ignore"):  # overflow to +-Inf on purpose: saturation
            x = (x.astype(np.float32) * np.float32(3e7)).astype(dtype)
    for axis in (1, -1, 0):
        c = x.shape[axis]
        scales = (np.abs(rng.standard_normal(c)) + 0.05).astype(np.float32)
        zp = None if zp_dtype is None else rng.integers(0, 100, size=c).astype(zp_dtype)
        got = run_both(xquant.npu_quantize, x, scales, zp, qdtype, axis, True)
        assert_same(got, golden.quantize(x, scales, zp, qdtype, axis, True), f"axis={axis}")
    # per-tensor: a single scale (axis ignored)
    got = run_both(xquant.npu_quantize, x, np.array([0.37], np.float32), None, qdtype, 7, True)
    assert_same(got, golden.quantize(x, np.array([0.37], np.float32), None, qdtype, 7, True))


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("qdtype", ["qint8", "quint4x2"])
@pytest.mark.parametrize("axis", [-2, -1, 0, 2])
def test_quantize_mul_mode(rng, dtype, qdtype, axis):
    x = with_edges(rng, 3 * 4 * 16, dtype, scale=5.0).reshape(3, 4, 16)
    d = 1 if axis == -2 else 2
    sdt = dtype
    for s_shape in ((x.shape[d],), (1,), tuple(x.shape[d] if i == d else 1 for i in range(3))):
        scales = (rng.standard_normal(s_shape) * 2).astype(np.float32).astype(sdt)
        offset = (rng.standard_normal(s_shape) * 3).astype(np.float32).astype(sdt)
        for zp in (None, offset):
            got = run_both(xquant.npu_quantize, x, scales, zp, qdtype, axis, False)
            assert_same(got, golden.quantize(x, scales, zp, qdtype, axis, False), f"scales {s_shape}")


def test_quantize_division_not_reciprocal():
    """x / s and x * (1 / s) differ on ties (SPEC rule 2): div_mode must divide."""
    s = np.float32(0.3)
    # (k + 0.5) * s in float32: x / s lands on or next to a tie, where the reciprocal's rounding error
    # decides the side.
    xs = ((np.arange(-2000, 2000, dtype=np.float32) + np.float32(0.5)) * s).astype(np.float32)
    by_div = np.rint(xs / s)
    by_recip = np.rint(xs * (np.float32(1) / s))
    differ = by_div != by_recip
    assert differ.any()  # the data contains such cases
    got = xquant.npu_quantize(xs, np.array([s]), None, "qint32", 1, True)
    assert np.array_equal(got, by_div.astype(np.int32))
    assert not np.array_equal(got, by_recip.astype(np.int32))


def test_quantize_nan_inf_saturation():
    x = np.array([[np.nan, np.inf, -np.inf, 1e30, -1e30, 127.5, -128.5, 2.5]], dtype=np.float32)
    s = np.array([1.0], np.float32)
    assert xquant.npu_quantize(x, s, None, "qint8").tolist() == [[0, 127, -128, 127, -128, 127, -128, 2]]
    assert xquant.npu_quantize(x, s, None, "quint8").tolist() == [[0, 255, 0, 255, 0, 128, 0, 2]]
    assert xquant.npu_quantize(x, s, None, "qint32").tolist() == [
        [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 128, -128, 2]]
    words = xquant.npu_quantize(x, s, None, "quint4x2", -1, False)
    assert golden.unpack_int4(words).tolist() == [[0, 7, -8, 7, -8, 7, -8, 2]]


# ---- 3. tile quant -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["SYM", "ASYM"])
def test_tile_quant_golden_padded_rows(rng, mode):
    m, n, pitch = 13, 37, 48
    wide_src = (rng.standard_normal((m, pitch)) * 40).astype(np.float32)
    wide_src[:, :10] = golden.F32(2.5)  # ties
    wide_src[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    src = wide_src[:, :n]  # a padded view: row pitch 48
    scale = (np.abs(rng.standard_normal((m, 1))) + 0.5).astype(np.float32)
    scale[:2] = 1.0  # rows 0 and 1: the ties 2.5 stay ties
    offset = rng.integers(0, 255, size=(m, 1)).astype(np.float32) if mode == "ASYM" else None
    odt = np.int8 if mode == "SYM" else np.uint8
    for kind in ("numpy", "torch") if torch is not None else ("numpy",):
        wide_out = np.full((m, pitch), 0x5A, dtype=odt)
        if kind == "numpy":
            xquant.quant(wide_out[:, :n], src, scale, mode, offset)
        else:
            t_out = torch.from_numpy(wide_out)  # shares memory with wide_out
            xquant.quant(t_out[:, :n], torch.from_numpy(wide_src)[:, :n], torch.from_numpy(scale), mode,
                         None if offset is None else torch.from_numpy(offset))
        assert_same(wide_out[:, :n], golden.tile_quant(src, scale, mode, offset), kind)
        assert np.all(wide_out[:, n:] == 0x5A), "the padding beyond N must not be written"


def test_tile_quant_scale_and_offset_columns_of_wider_arrays(rng):
    src = (rng.standard_normal((6, 8)) * 10).astype(np.float32)
    params = np.zeros((6, 3), np.float32)
    params[:, 0] = 2.0
    params[:, 2] = 100.0
    out = np.zeros((6, 8), np.uint8)
    xquant.quant(out, src, params[:, :1], "ASYM", params[:, 2:3])
    assert_same(out, golden.tile_quant(src, params[:, 0], "ASYM", params[:, 2]))
    # scale with pitch 3 and offset dense: different pitches are made dense for the caller
    out2 = np.zeros((6, 8), np.uint8)
    xquant.quant(out2, src, params[:, :1], xquant.QuantMode.ASYM, np.full((6, 1), 100.0, np.float32))
    assert_same(out2, out)


# ---- 4. dynamic quant ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("dst", ["qint8", "quint4x2"])
@pytest.mark.parametrize("quant_mode", ["pertoken", "pertensor"])
def test_dynamic_quant_golden(rng, dtype, dst, quant_mode):
    x = random_floats(rng, (3, 5, 32), dtype, scale=4.0)
    x[0, 0] = 1.5  # a constant row: the 1e-12 scale floor keeps scale and offset finite
    x[1, 2, 7] = np.nan  # a NaN row
    x[2, 1, 3] = np.inf
    got = run_both(xquant.npu_dynamic_quant_asymmetric, x, dst_type=dst, quant_mode=quant_mode)
    want = golden.dynamic_quant(x, dst=dst, quant_mode=quant_mode)
    for name, g, w in zip(("y", "scale", "offset"), got, want):
        assert_same(g, w, name)
    if quant_mode == "pertoken":
        assert got[1][0, 0] == np.float32(1e-12)  # constant row
        assert np.isnan(got[1][1, 2]) and np.isnan(got[2][1, 2])
        row = got[0][1, 2] if dst == "qint8" else golden.unpack_int4(got[0][1, 2])
        assert np.all(row == 0)


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("gi_dtype", [np.int32, np.int64])
def test_dynamic_quant_smooth_and_moe(rng, dtype, gi_dtype):
    x = random_floats(rng, (10, 16), dtype)
    smooth = (np.abs(rng.standard_normal(16)) + 0.1).astype(np.float32).astype(dtype)
    got = run_both(xquant.npu_dynamic_quant_asymmetric, x, smooth_scales=smooth)
    for g, w in zip(got, golden.dynamic_quant(x, smooth)):
        assert_same(g, w)
    smooth2 = (np.abs(rng.standard_normal((4, 16))) + 0.1).astype(np.float32).astype(dtype)
    gidx = np.array([3, 3, 7, 10], dtype=gi_dtype)  # expert 1 is empty
    for dst in ("qint8", "quint4x2"):
        got = run_both(xquant.npu_dynamic_quant_asymmetric, x, smooth_scales=smooth2, group_index=gidx,
                       dst_type=dst)
        for g, w in zip(got, golden.dynamic_quant(x, smooth2, gidx, dst)):
            assert_same(g, w)


# ---- 5. ActsULQ ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("fixed_min", [False, True])
@pytest.mark.parametrize("num_bits", [2, 4, 8, 16])
def test_acts_ulq_forward_golden(rng, dtype, fixed_min, num_bits):
    x = with_edges(rng, 6 * 40, dtype, scale=2.0).reshape(6, 40)
    cmin = (rng.standard_normal((6, 1)) - 0.5).astype(np.float32).astype(dtype)
    cmax = (np.abs(rng.standard_normal((1, 40))) * 2).astype(np.float32).astype(dtype)
    cmin[0, 0] = 0.3   # clamp_min > 0 -> ori_min 0
    cmin[1, 0] = -0.0
    cmax[0, 0] = 0.0   # below LEVELS * EPS -> the floor
    cmax[0, 1] = 1e-9
    got = run_both(xquant.acts_ulq, x, cmin, cmax, fixed_min=fixed_min, num_bits=num_bits)
    want = golden.acts_ulq(x, cmin, cmax, fixed_min, num_bits)
    for name, g, w in zip(("y", "clamp_min_mask", "clamp_max_mask", "x_clamped_loss"), got, want):
        assert_same(g, w, name)


@pytest.mark.parametrize("shapes", [((4, 5), (4, 5), (4, 5)), ((4, 5), (1,), (1,)), ((4, 5), (4, 1), (1, 5)),
                                    ((5,), (3, 1), ()), ((2, 3, 4), (3, 1), (2, 1, 4)), ((1, 4), (3, 1), (3, 4))])
@pytest.mark.parametrize("dtype", NP_DTYPES, ids=DT_IDS)
def test_acts_ulq_backward_golden_broadcast(rng, shapes, dtype):
    xs, lo_s, hi_s = shapes
    x = random_floats(rng, xs, dtype, scale=2.0)
    cmin = np.asarray(rng.standard_normal(lo_s) - 0.7).astype(np.float32).astype(dtype)
    cmax = np.asarray(np.abs(rng.standard_normal(hi_s)) + 0.3).astype(np.float32).astype(dtype)
    if cmin.size > 1:
        cmin.reshape(-1)[0] = 0.25  # clamp_min > 0: its gradient is zero
    if cmax.size > 1:
        cmax.reshape(-1)[0] = 1e-6  # below LEVELS * EPS: its gradient is zero
    fwd = xquant.acts_ulq(x, cmin, cmax)
    out_shape = fwd[0].shape
    dy = random_floats(rng, out_shape, dtype, scale=1.0)
    for fixed_min in (False, True):
        fwd = golden.acts_ulq(x, cmin, cmax, fixed_min)
        got = run_both(xquant.acts_ulq_backward, dy, xs, cmin, cmax, fwd[1], fwd[2], fwd[3], fixed_min=fixed_min)
        want = golden.acts_ulq_backward(dy, xs, cmin, cmax, fwd[1], fwd[2], fwd[3], fixed_min)
        for name, g, w in zip(("x_grad", "clamp_min_grad", "clamp_max_grad"), got, want):
            assert g.shape == w.shape
            assert_same(g, w, name)


def test_acts_ulq_backward_long_reduction(rng):
    """A scalar clamp_max reduced over 3000 positions: the canonical blocked sum."""
    x = (rng.standard_normal((3000,)) * 2).astype(np.float32)
    cmin, cmax = np.float32(-1.0), np.float32(1.5)
    y, m0, m1, loss = xquant.acts_ulq(x, cmin, cmax)
    dy = rng.standard_normal(3000).astype(np.float32)
    got = xquant.acts_ulq_backward(dy, x.shape, np.asarray(cmin), np.asarray(cmax), m0, m1, loss)
    want = golden.acts_ulq_backward(dy, x.shape, np.asarray(cmin), np.asarray(cmax), m0, m1, loss)
    for g, w in zip(got, want):
        assert_same(g, w)


# ---- empty tensors ---------------------------------------------------------------------------------------------

def test_empty_inputs_give_empty_outputs():
    e = np.zeros((0, 16), np.float32)
    assert xquant.npu_fake_tensor_quant(e, np.array([1.0], np.float32)).shape == (0, 16)
    assert xquant.npu_fake_tensor_quant_with_axis(e, np.ones(16, np.float32), 1).shape == (0, 16)
    assert xquant.npu_quantize(e, np.array([1.0], np.float32), None, "quint4x2", -1, False).shape == (0, 2)
    y, s, o = xquant.npu_dynamic_quant_asymmetric(e)
    assert y.shape == (0, 16) and s.shape == (0,) and o.shape == (0,)
    assert [a.shape for a in xquant.acts_ulq(e, np.float32(-1), np.float32(1))] == [(0, 16)] * 4
    out = np.zeros((0, 16), np.int8)
    xquant.quant(out, e, np.zeros((0, 1), np.float32))
    if torch is not None:
        t = torch.zeros(0, 3)
        assert xquant.npu_fake_tensor_quant(t, torch.tensor(1.0)).shape == (0, 3)
