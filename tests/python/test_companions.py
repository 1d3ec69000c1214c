"""npu_dynamic_quant (symmetric per token, SPEC section 6) and npu_anti_quant (dequantization, SPEC section 7)
through the Python bindings: NumPy goldens written here from the SPEC (not from the implementation), NumPy and
torch front ends bit for bit, every validation error (type and argument name), the custom operators under
torch.compile(fullgraph=True), and the round trip quantize -> anti_quant."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")
pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed (scripts/setup-python installs it)")

import numpy as np
import torch

import xquant
from golden import BF16
from tutil import NP_DTYPES, to_numpy, to_torch, with_edges

ops = torch.ops.xquant
QINT4 = torch.quint4x2
# canonical quiet NaN bits of each float output dtype (SPEC: a NaN scale / result is the canonical one)
_NAN_BITS = {np.dtype(np.float32): 0x7FC00000, np.dtype(np.float16): 0x7E00, BF16: 0x7FC0}
_UINT = {4: np.uint32, 2: np.uint16}


# ---- NumPy references, from SPEC sections 6 and 7 ----------------------------------------------------------

def _canonical_nan(a: np.ndarray) -> np.ndarray:
    """a with every NaN replaced by the canonical quiet NaN of its dtype (bits compared exactly)."""
    a = np.array(a, copy=True)
    bits = a.view(_UINT[a.dtype.itemsize])
    bits[np.isnan(a.astype(np.float32))] = _NAN_BITS[a.dtype]
    return a


def _sat_rint(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """SPEC rule 1 and 3: round half to even, NaN -> 0, saturate (+-Inf included)."""
    r = np.rint(v)
    r = np.where(np.isnan(r), 0.0, r)
    return np.clip(r, lo, hi).astype(np.int64)


def _pack_int4(q: np.ndarray) -> np.ndarray:
    """int values in [-8, 7], last dimension 8k -> int32 words, element 8k + j in bits [4j, 4j + 3]."""
    nib = (q.astype(np.int64) & 0xF).reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    words = np.zeros(nib.shape[:-1], dtype=np.uint64)
    for j in range(8):
        words |= nib[..., j].astype(np.uint64) << np.uint64(4 * j)
    return words.astype(np.uint32).view(np.int32)


def _unpack_int4(w: np.ndarray) -> np.ndarray:
    u = w.astype(np.int32).view(np.uint32).astype(np.int64)
    nib = np.stack([(u >> (4 * j)) & 0xF for j in range(8)], axis=-1)
    nib = np.where(nib >= 8, nib - 16, nib)
    return nib.reshape(*w.shape[:-1], w.shape[-1] * 8)


def ref_dynamic_quant(x, smooth=None, group_index=None, int4=False):
    """SPEC 6: x' = x * smooth[expert(row)]; scale = rowMax(|x'|) / DST_MAX; y = sat(rint(x' / scale))."""
    lo, hi = (-8, 7) if int4 else (-128, 127)
    h = x.shape[-1]
    rows = x.astype(np.float32).reshape(-1, h)
    with np.errstate(all="ignore"):
        if smooth is not None:
            sm = smooth.astype(np.float32)
            if group_index is None:
                rows = rows * sm
            else:
                ends = [int(v) for v in group_index]
                expert = np.array([next(e for e, end in enumerate(ends) if end > r) for r in range(rows.shape[0])],
                                  dtype=np.int64)
                rows = rows * sm[expert] if rows.shape[0] else rows
        amax = np.abs(rows).max(axis=1) if h else np.zeros(rows.shape[0], np.float32)  # NaN propagates
        scale = (amax.astype(np.float32) / np.float32(hi)).astype(np.float32)
        q = _sat_rint(rows / scale[:, None], lo, hi).reshape(x.shape)
    y = _pack_int4(q) if int4 else q.astype(np.int8)
    return y, _canonical_nan(scale.reshape(x.shape[:-1]))


def ref_anti_quant(x, scale, offset=None, dst=np.float16, int4=False):
    """SPEC 7: out = narrow((float(x) + offset) * scale), float32 add then float32 multiply."""
    v = (_unpack_int4(x) if int4 else x.astype(np.int64)).astype(np.float32)
    with np.errstate(all="ignore"):
        if offset is not None:
            v = (v + offset.astype(np.float32)).astype(np.float32)
        v = (v * scale.astype(np.float32)).astype(np.float32)
        out = v.astype(dst)
    return _canonical_nan(out)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def both(fn, *args, **kwargs):
    """fn on NumPy arrays and on the same data as torch tensors; the torch results as NumPy, checked equal
    bit for bit to the NumPy ones; returns the NumPy results."""
    n = fn(*args, **kwargs)
    conv = (lambda a: to_torch(a) if isinstance(a, np.ndarray) else
            (getattr(torch, a) if isinstance(a, str) and hasattr(torch, a) else a))
    t = fn(*[conv(a) for a in args], **{k: conv(v) for k, v in kwargs.items()})
    ns = n if isinstance(n, tuple) else (n,)
    ts = tuple(t) if isinstance(t, (tuple, list)) else (t,)
    assert len(ns) == len(ts)
    for a, b in zip(ns, ts):
        assert isinstance(a, np.ndarray) and isinstance(b, torch.Tensor)
        assert same_bits(to_numpy(b), a), "numpy and torch results differ"
    return n


# ---- npu_dynamic_quant: goldens ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=str)
@pytest.mark.parametrize("int4", [False, True], ids=["int8", "int4"])
def test_dynamic_quant_matches_spec(rng, dtype, int4):
    x = with_edges(rng, 6 * 5 * 32, dtype).reshape(6, 5, 32)
    x[1, 2] = 0  # a row of zeros: scale 0, y 0
    x[2, 0, :] = rng.standard_normal(32).astype(dtype)
    x[2, 0, 3] = np.inf  # +Inf: scale Inf, finite / Inf -> 0, Inf / Inf -> NaN -> 0
    x[3, 1, 7] = np.nan  # NaN row: scale NaN, y 0
    y, s = both(xquant.npu_dynamic_quant, x, dst_type="quint4x2" if int4 else None)
    wy, ws = ref_dynamic_quant(x, int4=int4)
    assert same_bits(y, wy) and same_bits(s, ws)
    assert s[1, 2] == 0 and not y.reshape(6, 5, -1)[1, 2].any()
    assert np.isnan(s[3, 1]) and not y.reshape(6, 5, -1)[3, 1].any()
    assert s.view(np.uint32)[3, 1] == 0x7FC00000


@pytest.mark.parametrize("int4", [False, True], ids=["int8", "int4"])
def test_dynamic_quant_ties_and_saturation(int4):
    hi = 7 if int4 else 127
    # rowMax = DST_MAX: scale 1 exactly, x / scale exact: ties round half to even
    ties = np.array([hi, 0.5, 1.5, 2.5, -2.5, -0.5, -3.5, 4.5], np.float32)
    # subnormal rowMax: scale underflows to 0, x / 0 = +-Inf saturates, 0 / 0 = NaN -> 0
    sub = np.array([1e-45, -1e-45, 0, 0, 1e-45, 0, -1e-45, 0], np.float32)
    # -Inf: scale Inf, -Inf / Inf = NaN -> 0, finite / Inf = -0 / 0
    inf = np.array([-np.inf, 1, -1, 5, 0, 0, 0, 0], np.float32)
    x = np.stack([ties, sub, inf])
    y, s = both(xquant.npu_dynamic_quant, x, dst_type="quint4x2" if int4 else "qint8")
    wy, ws = ref_dynamic_quant(x, int4=int4)
    assert same_bits(y, wy) and same_bits(s, ws)
    q = _unpack_int4(y) if int4 else y.astype(np.int64)
    lo = -8 if int4 else -128
    assert q[0].tolist() == [hi, 0, 2, 2, -2, 0, -4, 4]
    assert s[1] == 0 and q[1].tolist() == [hi, lo, 0, 0, hi, 0, lo, 0]
    assert s[2] == np.inf and not q[2].any()


def test_dynamic_quant_int4_nibble_order():
    x = np.array([[7, -8 * 7 / 8, 1, -1, 2, -2, 3, -3]], np.float32)  # rowMax 7: scale 1
    y, s = both(xquant.npu_dynamic_quant, x, dst_type="quint4x2")
    assert s.tolist() == [1.0] and y.dtype == np.int32 and y.shape == (1, 1)
    # element j in bits [4j, 4j + 3], two's complement nibbles: 7, -7, 1, -1, 2, -2, 3, -3
    assert y.view(np.uint32)[0, 0] == 0xD3E2F197


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=str)
def test_dynamic_quant_smooth_scales_and_groups(rng, dtype):
    x = with_edges(rng, 7 * 16, dtype).reshape(7, 16)
    smooth = (rng.random(16) * 2).astype(dtype)
    y, s = both(xquant.npu_dynamic_quant, x, smooth_scales=smooth)
    wy, ws = ref_dynamic_quant(x, smooth)
    assert same_bits(y, wy) and same_bits(s, ws)
    moe = (rng.random((4, 16)) * 2).astype(np.float32)
    for gdt in (np.int32, np.int64):
        ends = np.array([2, 2, 5, 7], gdt)  # an empty group in the middle
        for int4 in (False, True):
            y, s = both(xquant.npu_dynamic_quant, x, smooth_scales=moe, group_index=ends,
                        dst_type="quint4x2" if int4 else None)
            wy, ws = ref_dynamic_quant(x, moe, ends, int4)
            assert same_bits(y, wy) and same_bits(s, ws)


def test_dynamic_quant_empty_shapes():
    for shape in [(0, 16), (3, 0), (2, 0, 8), (0, 0)]:
        x = np.zeros(shape, np.float32)
        y, s = both(xquant.npu_dynamic_quant, x)
        assert y.shape == shape and y.dtype == np.int8 and s.shape == shape[:-1] and s.dtype == np.float32
        assert not s.any()  # H == 0: rowMax of nothing is 0
    y, s = both(xquant.npu_dynamic_quant, np.zeros((0, 16), np.float32), dst_type="quint4x2")
    assert y.shape == (0, 2) and y.dtype == np.int32


def test_signatures_are_torch_npus():
    import inspect

    def sig(f):
        return [(p.name, p.kind.name, p.default) for p in inspect.signature(f).parameters.values()]

    E, P, K = inspect.Parameter.empty, "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert sig(xquant.npu.npu_dynamic_quant) == [("x", P, E), ("smooth_scales", K, None), ("group_index", K, None),
                                                 ("dst_type", K, None), ("quant_mode", K, "pertoken"),
                                                 ("dst_type_max", K, 0.0)]
    assert sig(xquant.npu.npu_anti_quant) == [("x", P, E), ("scale", P, E), ("offset", K, None),
                                              ("dst_dtype", K, None), ("src_dtype", K, None)]


def test_dynamic_quant_torch_dtype_spellings():
    x = torch.randn(3, 16)
    want = xquant.npu_dynamic_quant(x)
    for d in (torch.int8, torch.qint8, "qint8", "int8", np.int8):
        got = xquant.npu_dynamic_quant(x, dst_type=d)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    y4, _ = xquant.npu_dynamic_quant(x, dst_type=QINT4)
    assert y4.dtype == torch.int32 and y4.shape == (3, 2)
    assert xquant.dynamic_quant is xquant.npu_dynamic_quant and "npu_dynamic_quant" in xquant.__all__


# ---- npu_anti_quant: goldens ---------------------------------------------------------------------------------

DSTS = [("float16", np.dtype(np.float16)), ("bfloat16", BF16), ("float32", np.dtype(np.float32))]


@pytest.mark.parametrize("dst,ndst", DSTS, ids=[d for d, _ in DSTS])
@pytest.mark.parametrize("sdt", [np.dtype(np.float32), BF16], ids=["scale_f32", "scale_bf16"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["scale_1", "scale_n"])
@pytest.mark.parametrize("with_offset", [False, True], ids=["no_offset", "offset"])
def test_anti_quant_int8_matches_spec(rng, dst, ndst, sdt, per_channel, with_offset):
    x = rng.integers(-128, 128, size=(5, 3, 24)).astype(np.int8)
    x[0, 0, :4] = [-128, 127, 0, -1]
    n = 24 if per_channel else 1
    scale = (rng.standard_normal(n) * 50).astype(np.float32).astype(sdt)
    if per_channel:
        scale[:6] = np.array([np.inf, np.nan, 0, 1e-30, 3e4, -6e4], np.float32).astype(sdt)  # Inf * 0 -> NaN too
    offset = (rng.standard_normal(n) * 10).astype(np.float32).astype(sdt) if with_offset else None
    got = both(xquant.npu_anti_quant, x, scale, offset=offset, dst_dtype=dst)
    assert same_bits(got, ref_anti_quant(x, scale, offset, ndst))


@pytest.mark.parametrize("dst,ndst", DSTS, ids=[d for d, _ in DSTS])
def test_anti_quant_int4_matches_spec(rng, dst, ndst):
    w = rng.integers(-(2**31), 2**31, size=(4, 3), dtype=np.int64).astype(np.int32)
    for scale in (np.float32([0.37]), (rng.random(24) * 3).astype(np.float32)):
        off = (rng.standard_normal(scale.size) * 2).astype(np.float32)
        got = both(xquant.npu_anti_quant, w, scale, offset=off, dst_dtype=dst, src_dtype="quint4x2")
        assert got.shape == (4, 24)
        assert same_bits(got, ref_anti_quant(w, scale, off, ndst, int4=True))


def test_anti_quant_int4_nibble_order_and_torch_dtype():
    w = np.array([[0x7654321F, np.uint32(0x89ABCDE0).view(np.int32)]], np.int32)
    got = both(xquant.npu_anti_quant, w, np.float32([1.0]), dst_dtype="float32", src_dtype="quint4x2")
    assert got.tolist() == [[-1, 1, 2, 3, 4, 5, 6, 7, 0, -2, -3, -4, -5, -6, -7, -8]]
    t = xquant.npu_anti_quant(torch.from_numpy(w), torch.ones(1), dst_dtype=torch.float32, src_dtype=QINT4)
    assert torch.equal(t, torch.from_numpy(got))


def test_anti_quant_narrowing_ties_overflow_and_defaults():
    x = np.array([[1, 1, 127, -128, 1, 3]], np.int8)
    # float16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1 (even); 127 * 1000 overflows to Inf;
    # 1e-6 is a float16 subnormal
    scale = np.float32([1 + 2**-11, 1 + 3 * 2**-11, 1000, 1000, 1e-6, 1 + 2**-11])
    h = both(xquant.npu_anti_quant, x, scale)  # dst_dtype defaults to float16
    assert h.dtype == np.float16 and same_bits(h, ref_anti_quant(x, scale))
    assert h[0, 0] == 1.0 and h[0, 1] == 1 + 2**-9 and h[0, 2] == np.inf and h[0, 3] == -np.inf
    # bfloat16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1
    b = both(xquant.npu_anti_quant, x, np.float32([1 + 2**-8] * 6), dst_dtype="bfloat16")
    assert b.dtype == BF16 and float(b[0, 0]) == 1.0
    assert same_bits(b, ref_anti_quant(x, np.float32([1 + 2**-8] * 6), None, BF16))
    # the offset is added before the multiplication: (x + offset) * scale, not x * scale + offset
    f = both(xquant.npu_anti_quant, x, np.float32([2.0]), offset=np.float32([0.5]), dst_dtype="float32")
    assert f.tolist() == [[3.0, 3.0, 255.0, -255.0, 3.0, 7.0]]
    assert xquant.anti_quant is xquant.npu_anti_quant and "npu_anti_quant" in xquant.npu.__all__


def test_anti_quant_empty_and_rank_1():
    for shape in [(0,), (3, 0), (0, 5)]:
        x = np.zeros(shape, np.int8)
        got = both(xquant.npu_anti_quant, x, np.float32([2.0]))
        assert got.shape == shape and got.dtype == np.float16
    got = both(xquant.npu_anti_quant, np.int8([1, -2, 3]), np.float32([1, 2, 3]), dst_dtype="float32")
    assert got.tolist() == [1.0, -4.0, 9.0]
    got = both(xquant.npu_anti_quant, np.zeros((2, 0), np.int32), np.float32([1.0]), src_dtype="quint4x2")
    assert got.shape == (2, 0)


# ---- round trips -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quantize_then_anti_quant_is_within_one_step(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 32, generator=g) * 4).to(dtype)
    scales = (x.float().abs().amax(dim=0) / 127 + 1e-3)
    q = xquant.npu_quantize(x, scales, None, torch.qint8, -1, True)
    back = xquant.npu_anti_quant(q, scales, dst_dtype=torch.float32)
    assert (back - x.float()).abs().le(scales).all()
    # dynamic (per row) int8 and int4, dequantized with a unit scale and rescaled per row
    for dst, step in ((None, 1.0), (QINT4, 1.0)):
        y, s = xquant.npu_dynamic_quant(x, dst_type=dst)
        d = xquant.npu_anti_quant(y, torch.ones(1), dst_dtype=torch.float32, src_dtype=dst)
        assert d.shape == x.shape
        assert ((d * s[:, None]) - x.float()).abs().le(step * s[:, None] * (1 + 1e-6)).all()


# ---- errors -------------------------------------------------------------------------------------------------

f32, i8, i32 = np.float32, np.int8, np.int32


def _x(*shape, dtype=f32):
    return np.ones(shape, dtype)


# (name, exception type, argument named, callable taking a converter applied to every array argument)
DQ_ERRORS = [
    ("x dtype", TypeError, "x", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8, dtype=i8)))),
    ("x float64", TypeError, "x", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8, dtype=np.float64)))),
    ("x rank", ValueError, "x", lambda c: xquant.npu_dynamic_quant(c(_x(8)))),
    ("dst_type quint8", ValueError, "dst_type", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), dst_type="quint8")),
    ("dst_type int32", ValueError, "dst_type", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), dst_type="int32")),
    ("dst_type float", ValueError, "dst_type", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), dst_type="float32")),
    ("dst_type object", TypeError, "dst_type", lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), dst_type=8.5)),
    ("int4 H", ValueError, "x", lambda c: xquant.npu_dynamic_quant(c(_x(2, 12)), dst_type="quint4x2")),
    ("group without smooth", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), group_index=c(np.int32([2])))),
    ("smooth dtype", TypeError, "smooth_scales",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(8, dtype=i32)))),
    ("smooth 1-D length", ValueError, "smooth_scales",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(7)))),
    ("smooth 2-D without group", ValueError, "smooth_scales",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(2, 8)))),
    ("smooth 1-D with group", ValueError, "smooth_scales",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(8)), group_index=c(np.int32([2])))),
    ("smooth H with group", ValueError, "smooth_scales",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(1, 4)), group_index=c(np.int32([2])))),
    ("group dtype", TypeError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(1, 8)), group_index=c(_x(1)))),
    ("group shape", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(1, 8)), group_index=c(np.int32([1, 2])))),
    ("zero experts", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(0, 8)), group_index=c(np.int32([])))),
    ("group value range", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(2, 8)), smooth_scales=c(_x(2, 8)), group_index=c(np.int64([-1, 2])))),
    ("group decreasing", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(4, 8)), smooth_scales=c(_x(3, 8)), group_index=c(np.int32([2, 1, 4])))),
    ("group last", ValueError, "group_index",
     lambda c: xquant.npu_dynamic_quant(c(_x(4, 8)), smooth_scales=c(_x(2, 8)), group_index=c(np.int32([1, 3])))),
    ("x not an array", TypeError, "x", lambda c: xquant.npu_dynamic_quant([[1.0] * 8])),
]

AQ_ERRORS = [
    ("src_dtype quint8", ValueError, "src_dtype",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), src_dtype="quint8")),
    ("src_dtype object", TypeError, "src_dtype",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), src_dtype=1.5)),
    ("x dtype int8 mode", TypeError, "x", lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i32)), c(_x(1)))),
    ("x float", TypeError, "x", lambda c: xquant.npu_anti_quant(c(_x(2, 8)), c(_x(1)))),
    ("x dtype int4 mode", TypeError, "x",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), src_dtype="quint4x2")),
    ("x rank 0", ValueError, "x", lambda c: xquant.npu_anti_quant(c(np.array(3, dtype=np.int8)), c(_x(1)))),
    ("scale dtype", TypeError, "scale",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(8, dtype=np.float16)))),
    ("scale length", ValueError, "scale", lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(4)))),
    ("scale 2-D", ValueError, "scale", lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1, 8)))),
    ("scale int4 length", ValueError, "scale",
     lambda c: xquant.npu_anti_quant(c(_x(2, 1, dtype=i32)), c(_x(1)[[0, 0]]), src_dtype="quint4x2")),
    ("offset dtype", TypeError, "offset",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(8)), offset=c(_x(8, dtype=i8)))),
    ("offset shape", ValueError, "offset",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(8)), offset=c(_x(1)))),
    ("dst_dtype int8", ValueError, "dst_dtype",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), dst_dtype="int8")),
    ("dst_dtype float64", ValueError, "dst_dtype",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), dst_dtype="float64")),
    ("dst_dtype object", TypeError, "dst_dtype",
     lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), c(_x(1)), dst_dtype=16)),
    ("scale kind", TypeError, "scale", lambda c: xquant.npu_anti_quant(c(_x(2, 8, dtype=i8)), [1.0])),
]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("op,name,etype,arg,fn", [("dynamic_quant",) + e for e in DQ_ERRORS] +
                         [("anti_quant",) + e for e in AQ_ERRORS],
                         ids=[f"dq {e[0]}" for e in DQ_ERRORS] + [f"aq {e[0]}" for e in AQ_ERRORS])
def test_errors_name_the_argument(kind, op, name, etype, arg, fn):
    conv = (lambda a: a) if kind == "numpy" else to_torch
    with pytest.raises(etype) as info:
        fn(conv)
    msg = str(info.value)
    assert re.match(rf"xquant::{op}: {arg}(\[\d+\])? ", msg), msg
    assert re.search(r"expected|does not support|not a", msg), msg


def test_torch_dtype_arguments_errors():
    x8 = torch.ones(2, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"^xquant::anti_quant: dst_dtype is torch.int8 but expected float16"):
        xquant.npu_anti_quant(x8, torch.ones(1), dst_dtype=torch.int8)
    with pytest.raises(ValueError, match=r"^xquant::anti_quant: dst_dtype is torch.float64 "):
        xquant.npu_anti_quant(x8, torch.ones(1), dst_dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^xquant::anti_quant: src_dtype is quint8 but expected qint8 or quint4x2"):
        xquant.npu_anti_quant(x8, torch.ones(1), src_dtype=torch.quint8)
    with pytest.raises(ValueError, match=r"^xquant::dynamic_quant: dst_type is quint8 but expected qint8, quint4x2, "
                                         r"float8_e4m3fn or float8_e5m2"):
        xquant.npu_dynamic_quant(torch.ones(2, 8), dst_type=torch.quint8)
    with pytest.raises(ValueError, match=r"^xquant::dynamic_quant: dst_type is torch.float16 but expected one of"):
        xquant.npu_dynamic_quant(torch.ones(2, 8), dst_type=torch.float16)
    with pytest.raises(TypeError, match=r"^xquant::dynamic_quant: smooth_scales is .* but expected a torch.Tensor"):
        xquant.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=np.ones(8, np.float32))
    with pytest.raises(TypeError, match=r"^xquant::anti_quant: offset is .* but expected a numpy.ndarray"):
        xquant.npu_anti_quant(np.ones((2, 8), np.int8), np.ones(8, np.float32), offset=torch.ones(8))


def test_errors_leave_inputs_unchanged():
    x = torch.randn(4, 8)
    x0 = x.clone()
    with pytest.raises(ValueError):
        xquant.npu_dynamic_quant(x, smooth_scales=torch.ones(2, 8), group_index=torch.tensor([1, 3]))
    assert torch.equal(x, x0)


# ---- torch integration ---------------------------------------------------------------------------------------

def test_non_contiguous_inputs_are_read_as_they_show():
    x = torch.randn(16, 6).t()
    assert not x.is_contiguous()
    for a, b in zip(xquant.npu_dynamic_quant(x), xquant.npu_dynamic_quant(x.contiguous())):
        assert torch.equal(a, b)
    w = torch.randint(-128, 128, (16, 6), dtype=torch.int8).t()
    s = torch.rand(32)[::2]
    assert torch.equal(xquant.npu_anti_quant(w, s), xquant.npu_anti_quant(w.contiguous(), s.contiguous()))


def test_custom_ops_equal_eager_and_compile_fullgraph():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 16, generator=g)
    smooth = torch.rand(16, generator=g) + 0.5
    ws = torch.rand(16, generator=g, dtype=torch.float32).bfloat16()

    def step(x, smooth, ws):
        y, s = xquant.npu_dynamic_quant(x, smooth_scales=smooth, dst_type=torch.quint4x2)
        d = xquant.npu_anti_quant(y, ws, offset=ws, dst_dtype=torch.bfloat16, src_dtype=torch.quint4x2)
        return y, s, d

    eager = step(x, smooth, ws)
    full = (*ops.dynamic_quant(x, smooth, None, torch.quint4x2),
            ops.anti_quant(eager[0], ws, ws, torch.bfloat16, torch.quint4x2))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(x, smooth, ws)
    for a, b, c in zip(eager, full, compiled):
        assert a.dtype == b.dtype == c.dtype and a.shape == b.shape == c.shape
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.uint8) if b.dtype == torch.bfloat16 else b)
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a,
                           c.view(torch.uint8) if c.dtype == torch.bfloat16 else c)


def test_opcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 6, 16, generator=g)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.dynamic_quant, (x,), test_utils=tests)
    torch.library.opcheck(ops.dynamic_quant, (x.half(), torch.rand(3, 16, generator=g), torch.tensor([8, 8, 24]),
                                              torch.quint4x2), test_utils=tests)
    w = torch.randint(-128, 128, (5, 16), dtype=torch.int8, generator=g)
    torch.library.opcheck(ops.anti_quant, (w, torch.rand(16, generator=g)), test_utils=tests)
    torch.library.opcheck(ops.anti_quant, (w.view(torch.int32), torch.rand(1, generator=g).bfloat16(),
                                           torch.rand(1, generator=g).bfloat16(), torch.float32, torch.quint4x2),
                          test_utils=tests)


def test_meta_shapes_equal_eager():
    x = torch.randn(3, 5, 16)
    w = torch.randint(-2**31, 2**31 - 1, (3, 2), dtype=torch.int32)
    calls = [lambda d: xquant.npu_dynamic_quant(d(x)),
             lambda d: xquant.npu_dynamic_quant(d(x), smooth_scales=d(torch.ones(16)), dst_type=QINT4),
             lambda d: xquant.npu_anti_quant(d(w), d(torch.ones(16)), src_dtype=QINT4, dst_dtype=torch.bfloat16),
             lambda d: xquant.npu_anti_quant(d(w.view(torch.int8)), d(torch.ones(1)))]
    for call in calls:
        real = torch.utils._pytree.tree_leaves(call(lambda v: v))
        meta = torch.utils._pytree.tree_leaves(call(lambda v: v.to("meta")))
        assert [(r.shape, r.dtype) for r in real] == [(m.shape, m.dtype) for m in meta]
