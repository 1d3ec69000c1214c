"""npu_dynamic_quant / npu_dynamic_quant_asymmetric in op-plugin 26.x's form (docs/semantics.md section 5.6):
float8 outputs, quant_mode pertensor / perchannel for both, torch_npu's integer dtype codes, dst_type_max,
and the float32 -> float8 conversion against torch's own cast. Goldens are computed here with NumPy and
ml_dtypes (the Ascend kernels' golden formulas), compared bit for bit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np  # noqa: E402

import xquant
from xquant import npu

F8 = {"float8_e4m3fn": (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn, 448.0),
      "float8_e5m2": (torch.float8_e5m2, ml_dtypes.float8_e5m2, 57344.0)}


def f8_bits(a: np.ndarray, np_dt) -> np.ndarray:
    """float32 values -> float8 codes via ml_dtypes (NaN: 0x7F, as the operators write it)."""
    b = a.astype(np.float32).astype(np_dt).view(np.uint8).copy()
    b[np.isnan(a)] = 0x7F
    return b


def golden(x: np.ndarray, name: str, symmetric: bool, mode: str, smooth=None):
    """The documented formulas in float32: reduction over rows (pertoken), everything (pertensor) or the
    second-to-last axis (perchannel); y as float8 codes or int8."""
    xs = x.astype(np.float32)
    if smooth is not None:
        s = smooth.astype(np.float32)
        xs = xs * (s[:, None] if mode == "perchannel" else s)
    if name == "int8":
        dmax, dmin = np.float32(127), np.float32(-128)
    else:
        dmax = np.float32(F8[name][2])
        dmin = -dmax
    axis = {"pertoken": -1, "pertensor": None, "perchannel": -2}[mode]
    keep = mode != "pertensor"
    with np.errstate(all="ignore"):
        if symmetric:
            scale = np.max(np.abs(xs), axis=axis, keepdims=keep) / dmax
            v = xs / scale
            offset = None
        else:
            mx, mn = np.max(xs, axis=axis, keepdims=keep), np.min(xs, axis=axis, keepdims=keep)
            scale = np.maximum((mx - mn) / (dmax - dmin), np.float32(1e-12))
            offset = dmax - mx / scale
            v = xs / scale + offset
    if name == "int8":
        y = np.clip(np.nan_to_num(np.rint(v), nan=0.0), -128, 127).astype(np.int8).view(np.uint8)
    else:
        y = f8_bits(v, F8[name][1])
    squeeze = (lambda a: np.asarray(a, np.float32).reshape(1)) if mode == "pertensor" else \
        (lambda a: np.squeeze(a, axis=axis))
    return y, squeeze(scale), None if offset is None else squeeze(offset)


def as_bits(y) -> np.ndarray:
    """1-byte outputs (int8, float8) as their uint8 bits, torch or NumPy."""
    if isinstance(y, torch.Tensor):
        return y.view(torch.uint8).numpy()
    return y.view(np.uint8)


def same_f32(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32)[~np.isnan(a)], b.view(np.uint32)[~np.isnan(b)]) \
        and np.array_equal(np.isnan(a), np.isnan(b))


@pytest.mark.parametrize("name", sorted(F8))
def test_float8_conversion_matches_torch(rng, name):
    """A row whose max |x| is the format's largest finite value has scale 1, so y = float8(x): 2^20 random
    float32 patterns of magnitude <= that maximum (ties, subnormals and zeros included) against torch's cast."""
    tdt, _, mx = F8[name]
    n = 1 << 20
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32).copy()
    v[~np.isfinite(v) | (np.abs(v) > mx)] = 0.5
    # the values exactly half way between neighbours and just off them, every exponent of the format
    q = np.float32(mx)
    ties = torch.arange(256, dtype=torch.uint8).view(tdt).float().numpy()
    ties = ties[np.isfinite(ties)]
    ties.sort()
    mids = ((ties[:-1].astype(np.float64) + ties[1:]) / 2).astype(np.float32)
    v[:mids.size] = mids
    v[mids.size:2 * mids.size] = np.nextafter(mids, np.float32(np.inf))
    v[2 * mids.size:3 * mids.size] = np.nextafter(mids, np.float32(-np.inf))
    rows = v.reshape(-1, 1024)
    rows[:, 0] = q
    x = torch.from_numpy(rows)
    y, scale = npu.npu_dynamic_quant(x, dst_type=tdt)
    assert y.dtype == tdt and torch.all(scale == 1.0)
    want = x.to(tdt)
    assert torch.equal(y.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("name", ["int8", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("mode", ["pertoken", "pertensor", "perchannel"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_goldens_numpy_and_torch(rng, name, symmetric, mode, dtype):
    x = (rng.standard_normal((3, 7, 40)) * 3).astype(dtype)
    x[0, 0, :3] = [0, -0.0, 1.5]
    smooth = None if mode == "pertensor" else (rng.random(7 if mode == "perchannel" else 40) + 0.5).astype(dtype)
    wy, ws, wo = golden(x.astype(np.float32), name, symmetric, mode, None if smooth is None else
                        smooth.astype(np.float32))
    dst = None if name == "int8" else name
    f = npu.npu_dynamic_quant if symmetric else npu.npu_dynamic_quant_asymmetric
    tx = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16 if dtype is ml_dtypes.bfloat16 else
                                                   torch.from_numpy(np.zeros(1, dtype)).dtype)
    ts = None if smooth is None else torch.from_numpy(smooth.astype(np.float32)).to(tx.dtype)
    for args in ((x, smooth, dst), (tx, ts, None if dst is None else F8[dst][0])):
        out = f(args[0], smooth_scales=args[1], dst_type=args[2], quant_mode=mode)
        y = out[0]
        assert np.array_equal(as_bits(y).reshape(wy.shape), wy), (name, mode)
        assert same_f32(np.asarray(out[1]), ws)
        if not symmetric:
            assert same_f32(np.asarray(out[2]), wo)
    if name != "int8":  # NumPy float8 outputs are ml_dtypes arrays
        assert f(x, dst_type=name, quant_mode=mode)[0].dtype == np.dtype(F8[name][1])


def test_perchannel_shapes_and_op_plugin_reference(rng):
    """The Ascend950 case of op-plugin's test (bfloat16 [2, 32, 256], smooth_scales [32]): y, scale
    [2, 256] as its reference computes them (x * smooth[:, None], max over dim -2)."""
    x = torch.randn(2, 32, 256, dtype=torch.bfloat16)
    s = torch.randn(32, dtype=torch.bfloat16)
    y, scale = npu.npu_dynamic_quant(x, smooth_scales=s, quant_mode="perchannel")
    xs = x.float() * s.float()[:, None]
    want_scale = xs.abs().amax(dim=-2) / 127
    assert y.shape == x.shape and y.dtype == torch.int8 and scale.shape == (2, 256)
    assert torch.equal(scale, want_scale)
    assert torch.equal(y, torch.round(xs / want_scale[:, None, :]).clamp(-128, 127).to(torch.int8))
    y, scale, offset = npu.npu_dynamic_quant_asymmetric(x, quant_mode="perchannel", dst_type=torch.float8_e4m3fn)
    assert y.dtype == torch.float8_e4m3fn and scale.shape == offset.shape == (2, 256)
    e = torch.empty(2, 0, 8)  # S == 0: every (b, h) gets the empty reduction's parameters
    y, scale = npu.npu_dynamic_quant(e, quant_mode="perchannel")
    assert y.shape == (2, 0, 8) and torch.equal(scale, torch.zeros(2, 8))


def test_integer_dtype_codes():
    x = torch.randn(4, 16)
    for code, d in ((1, torch.int8), (12, torch.qint8), (16, torch.quint4x2), (23, torch.float8_e5m2),
                    (24, torch.float8_e4m3fn), (291, torch.float8_e5m2), (292, torch.float8_e4m3fn)):
        for f in (npu.npu_dynamic_quant, npu.npu_dynamic_quant_asymmetric):
            got, want = f(x, dst_type=code), f(x, dst_type=d)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                                                          w.view(torch.uint8) if w.element_size() == 1 else w)
        got = npu.npu_dynamic_quant(x.numpy(), dst_type=code)[0]
        assert got.dtype == (np.int32 if code == 16 else np.int8 if code in (1, 12) else
                             np.dtype(F8["float8_e5m2" if code in (23, 291) else "float8_e4m3fn"][1]))
    for bad, what in ((290, "torch_npu.hifloat8"), (296, "torch_npu.float4_e2m1fn_x2"), (285, "torch_npu.int4")):
        with pytest.raises(ValueError, match=rf"^xquant::dynamic_quant: dst_type is {bad} \({what}\) but torch has "
                                             "no dtype"):
            npu.npu_dynamic_quant(x, dst_type=bad)
    with pytest.raises(ValueError, match=r"^xquant::dynamic_quant_asymmetric: dst_type is 7 but expected a dtype "
                                         r"code of int8 \(1\)"):
        npu.npu_dynamic_quant_asymmetric(x, dst_type=7)


def test_keyword_errors():
    x = torch.randn(4, 16)
    for f, op in ((npu.npu_dynamic_quant, "dynamic_quant"),
                  (npu.npu_dynamic_quant_asymmetric, "dynamic_quant_asymmetric")):
        for xx in (x, x.numpy()):
            with pytest.raises(ValueError, match=rf"^xquant::{op}: dst_type_max is 15.0 but expected 0.0: the NPU "
                                                 "applies it to hifloat8"):
                f(xx, dst_type_max=15.0)
            with pytest.raises(ValueError, match=rf"^xquant::{op}: quant_mode is 'perrow' but expected 'pertoken', "
                                                 "'pertensor' or 'perchannel'"):
                f(xx, quant_mode="perrow")
            with pytest.raises(ValueError, match=rf"^xquant::{op}: dst_type is quint4x2 with quant_mode perchannel"):
                f(xx, quant_mode="perchannel", dst_type="quint4x2")
            with pytest.raises(ValueError, match=rf"^xquant::{op}: smooth_scales has shape \[16\] but expected "
                                                 r"\[4\]"):
                f(xx, quant_mode="perchannel", smooth_scales=xx[0])
        # the same keywords through torch.ops.xquant
        with pytest.raises(ValueError, match="dst_type_max"):
            getattr(torch.ops.xquant, op)(x, dst_type_max=1.0)


def test_meta_shapes():
    x = torch.empty(2, 4, 16, device="meta")
    y, s = torch.ops.xquant.dynamic_quant(x, dst_type=torch.float8_e5m2, quant_mode="perchannel")
    assert y.dtype == torch.float8_e5m2 and y.shape == (2, 4, 16) and s.shape == (2, 16)
    y, s, o = torch.ops.xquant.dynamic_quant_asymmetric(x, quant_mode="pertensor")
    assert y.dtype == torch.int8 and s.shape == o.shape == (1,)
