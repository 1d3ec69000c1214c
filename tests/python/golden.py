"""Independent NumPy goldens of every SPEC.md formula (float32 arithmetic: np.float32 operations, np.rint
for round-half-to-even), written from SPEC.md alone, never by calling xquant.

Conventions: inputs are widened to float32 exactly (float16 / bfloat16 -> float32), every formula is
evaluated in float32 in SPEC's order (division stays division, multiplication stays multiplication), and
floating results are narrowed once (round to nearest even) to the input's dtype.
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

F32 = np.float32


def widen(a) -> np.ndarray:
    """Any float array (float32 / float16 / bfloat16) -> float32, exactly."""
    return np.asarray(a).astype(np.float32)


def narrow(v32: np.ndarray, dtype) -> np.ndarray:
    """float32 -> dtype, round to nearest even (NumPy's float16 and ml_dtypes' bfloat16 casts are)."""
    return np.asarray(v32, dtype=np.float32).astype(dtype)


def nan_min(a, b):
    """SPEC rule 4 min: NaN if either operand is NaN, else (b < a ? b : a)."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    return np.where(np.isnan(a) | np.isnan(b), F32(np.nan), np.where(b < a, b, a)).astype(F32)


def nan_max(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    return np.where(np.isnan(a) | np.isnan(b), F32(np.nan), np.where(b > a, b, a)).astype(F32)


def sat_int(r: np.ndarray, lo: int, hi: int, dtype) -> np.ndarray:
    """SPEC rule 3 on rounded float32 values: NaN -> 0, +-Inf and out-of-range values saturate.
    Compared in float64 so that 2^31 - 1 is exact."""
    r64 = np.asarray(r, dtype=np.float64)
    r64 = np.where(np.isnan(r64), 0.0, np.clip(r64, lo, hi))
    return r64.astype(np.int64).astype(dtype)


def pack_int4(v: np.ndarray) -> np.ndarray:
    """int4 values in [-8, 7] -> int32 words, element 8k + j in bits [4j, 4j + 3] of word k (flat order
    along the last dimension, two's complement nibbles)."""
    v = np.asarray(v, dtype=np.int64)
    assert v.shape[-1] % 8 == 0
    nib = (v & 0xF).astype(np.uint64).reshape(v.shape[:-1] + (v.shape[-1] // 8, 8))
    words = np.zeros(nib.shape[:-1], dtype=np.uint64)
    for j in range(8):
        words |= nib[..., j] << np.uint64(4 * j)
    return words.astype(np.uint32).view(np.int32)


def unpack_int4(words: np.ndarray) -> np.ndarray:
    w = np.asarray(words, dtype=np.int32).view(np.uint32).astype(np.int64)
    nibs = np.stack([(w >> (4 * j)) & 0xF for j in range(8)], axis=-1)
    nibs = np.where(nibs >= 8, nibs - 16, nibs)
    return nibs.reshape(w.shape[:-1] + (w.shape[-1] * 8,))


def canonical_sum(terms) -> np.float32:
    """SPEC rule 5's fixed blocking (the library's CanonicalSum): chunks of 1024 consecutive terms; in a
    chunk, term n goes to double lane n % 16 (added in order, lanes start at -0.0); the 16 lanes are folded
    by halving (i += i + 8, then + 4, + 2, + 1); chunk values are added in order into a double total
    (starting at -0.0), rounded once to float32. An empty sum is +0."""
    t = np.asarray(terms, dtype=np.float32).reshape(-1).astype(np.float64)
    if t.size == 0:
        return F32(0.0)
    total = -0.0
    for start in range(0, t.size, 1024):
        chunk = t[start:start + 1024]
        lanes = np.full(16, -0.0)
        for j in range(16):
            part = chunk[j::16]
            if part.size:
                lanes[j] = -0.0 + np.cumsum(part)[-1]  # sequential left-to-right adds
        w = 8
        while w >= 1:
            lanes[:w] = lanes[:w] + lanes[w:2 * w]
            w //= 2
        total = total + lanes[0]
    return F32(total)


# ---- 1. fake tensor quant ------------------------------------------------------------------------------------

def fake_quant_bounds(num_bits: int, is_unsigned: bool, narrow_range: bool) -> tuple[np.float32, np.float32]:
    bound = (1 << (num_bits - 1 + int(is_unsigned))) - 1  # exact Python integers
    max_bound = bound
    min_bound = -(bound + (0 if narrow_range else 1))  # also when unsigned: the formula and the kernel
    return F32(min_bound), F32(max_bound)  # converted to float32 once


def _channel_view(x32: np.ndarray, a32: np.ndarray, axis):
    """amax broadcast against x: per-tensor (axis None) or along axis."""
    if axis is None:
        return a32.reshape(())
    ax = axis % x32.ndim
    shape = [1] * x32.ndim
    shape[ax] = x32.shape[ax]
    return a32.reshape(shape)


def _fake_quant_half(x, amax, axis, num_bits, is_unsigned, narrow_range):
    """float16 inputs: every step in NumPy's float16 arithmetic (the Ascend kernel's half ops)."""
    F16 = np.float16
    lo, hi = fake_quant_bounds(num_bits, is_unsigned, narrow_range)
    x16 = np.asarray(x)
    a16 = widen(amax).reshape(-1).astype(F16)
    assert np.array_equal(a16.astype(F32), widen(amax).reshape(-1)), "amax must be exact in float16"
    with np.errstate(all="ignore"):
        M, m = F16(hi), F16(lo)                                      # round to nearest even, overflow -> Inf
        scale = (M / a16).astype(F16)                                # f16(M / amax)
        s = _channel_view(x16, scale, axis)
        t = (x16 * s).astype(F16)                                    # f16(x * scale)
        q = np.rint(t)
        q = np.where(q > M, M, q)                                    # ClampMax, ClampMin (NaN kept)
        q = np.where(q < m, m, q).astype(F16)
        out = (q / s).astype(F16)                                    # f16(q / scale)
        zero = ~np.isfinite(s) | (s == 0)
        out = np.where(zero, np.where(np.isnan(x16), x16, F16(0.0)), out).astype(F16)
    return out


def fake_quant(x, amax, axis=None, num_bits=8, is_unsigned=False, narrow_range=True):
    if np.asarray(x).dtype == np.float16:
        return _fake_quant_half(x, amax, axis, num_bits, is_unsigned, narrow_range)
    x32, a32 = widen(x), widen(amax).reshape(-1)
    lo, hi = fake_quant_bounds(num_bits, is_unsigned, narrow_range)
    with np.errstate(all="ignore"):
        scale = (hi / a32).astype(F32)                               # scale = max_bound / amax
        s = _channel_view(x32, scale, axis)
        q = np.rint(x32 * s)                                         # rint(x * scale)
        q = np.where(q < lo, lo, q)                                  # clamp keeping NaN
        q = np.where(q > hi, hi, q)
        out = (q / s).astype(F32)                                    # / scale
        zero = ~np.isfinite(s) | (s == 0)                            # that channel's output is 0
        out = np.where(zero, np.where(np.isnan(x32), x32, F32(0.0)), out).astype(F32)
    return narrow(out, np.asarray(x).dtype)


def fake_quant_backward(grad_out, x, amax, axis=None, num_bits=8, is_unsigned=False, narrow_range=True):
    """(grad_inputs, grad_amax) per SPEC section 1's straight-through estimator and PACT-style amax grad."""
    g32, x32, a32 = widen(grad_out), widen(x), widen(amax).reshape(-1)
    lo, hi = fake_quant_bounds(num_bits, is_unsigned, narrow_range)
    with np.errstate(all="ignore"):
        if np.asarray(x).dtype == np.float16:                        # the float16 scale, widened
            scale = (np.float16(hi) / a32.astype(np.float16)).astype(np.float16).astype(F32)
        else:
            scale = (hi / a32).astype(F32)
        grad_lo = (lo / scale).astype(F32)
        grad_hi = (hi / scale).astype(F32)
        ratio = F32(lo / hi)
        glo, ghi = _channel_view(x32, grad_lo, axis), _channel_view(x32, grad_hi, axis)
        inside = (x32 >= glo) & (x32 <= ghi)
        grad_in = np.where(inside, g32, F32(0.0)).astype(F32)
        factor = np.where(x32 > ghi, F32(1.0), np.where(x32 < glo, ratio, F32(0.0))).astype(F32)
        terms = (g32 * factor).astype(F32)
    if axis is None:
        ga = np.array([canonical_sum(terms)], dtype=F32)
    else:
        ax = axis % x32.ndim
        c = x32.shape[ax]
        outer = int(np.prod(x32.shape[:ax], dtype=np.int64))
        t3 = terms.reshape(outer, c, -1)
        ga = np.array([canonical_sum(t3[:, k, :]) for k in range(c)], dtype=F32)  # (o, i) order
    amax_arr = np.asarray(amax)
    return narrow(grad_in, np.asarray(x).dtype), narrow(ga.reshape(amax_arr.shape), amax_arr.dtype)


# ---- 2. npu_quantize ------------------------------------------------------------------------------------------

_RANGES = {"qint8": (-128, 127, np.int8), "quint8": (0, 255, np.uint8), "qint32": (-2**31, 2**31 - 1, np.int32),
           "quint4x2": (-8, 7, None)}


def quantize(x, scales, zero_points, dtype: str, axis=1, div_mode=True):
    x32 = widen(x)
    s32 = widen(scales)
    zp32 = np.zeros_like(s32) if zero_points is None else np.asarray(zero_points).astype(np.float32)
    rank = x32.ndim
    if s32.size == 1:
        s_b, z_b = s32.reshape(()), zp32.reshape(())
    else:
        if div_mode:
            d = axis % rank
        else:
            d = rank - 2 if axis == -2 else rank - 1
        shape = [1] * rank
        shape[d] = x32.shape[d]
        s_b, z_b = s32.reshape(shape), zp32.reshape(shape)
    with np.errstate(all="ignore"):
        scaled = (x32 / s_b) if div_mode else (x32 * s_b)           # division or multiplication ...
        v = (scaled.astype(F32) + z_b).astype(F32)                  # ... then the addition
        r = np.rint(v)
    lo, hi, dt = _RANGES[dtype]
    if dtype == "quint4x2":
        return pack_int4(sat_int(r, lo, hi, np.int64))
    return sat_int(r, lo, hi, dt)


# ---- 3. tile quant --------------------------------------------------------------------------------------------

def tile_quant(src, scale, mode="SYM", offset=None):
    s32 = np.asarray(src, np.float32)
    sc = np.asarray(scale, np.float32).reshape(-1, 1)
    with np.errstate(all="ignore"):
        if mode == "SYM":
            return sat_int(np.rint((s32 * sc).astype(F32)), -128, 127, np.int8)
        v = ((s32 * sc).astype(F32) + np.asarray(offset, np.float32).reshape(-1, 1)).astype(F32)
        return sat_int(np.rint(v), 0, 255, np.uint8)


# ---- 4. dynamic quant -----------------------------------------------------------------------------------------

def dynamic_quant(x, smooth_scales=None, group_index=None, dst="qint8", quant_mode="pertoken"):
    x32 = widen(x)
    h = x32.shape[-1]
    rows = x32.reshape(-1, h)
    s_rows = rows.shape[0]
    if smooth_scales is not None:
        sm = widen(smooth_scales).reshape(-1, h)
        if group_index is None:
            expert = np.zeros(s_rows, dtype=np.int64)
        else:
            ends = np.asarray(group_index, dtype=np.int64)
            expert = np.array([int(np.argmax(ends > r)) for r in range(s_rows)], dtype=np.int64)
        rows = (rows * sm[expert]).astype(F32)                      # x' = x * smooth
    dmax, dmin = (F32(7), F32(-8)) if dst == "quint4x2" else (F32(127), F32(-128))

    def params(block):
        if block.size == 0:
            mx = mn = F32(0.0)
        else:
            mx, mn = F32(np.max(block)), F32(np.min(block))          # NaN anywhere -> NaN
        with np.errstate(all="ignore"):
            scale = F32((mx - mn) / (dmax - dmin))
            scale = F32(nan_max(scale, F32(1e-12)))                  # max(..., 1e-12), NaN stays NaN
            offset = F32(dmax - F32(mx / scale))
        return scale, offset

    if quant_mode == "pertensor":
        sc, off = params(rows)
        scale = np.full(s_rows, sc, F32)
        offset = np.full(s_rows, off, F32)
        scale_out, offset_out = np.array([sc], F32), np.array([off], F32)
    else:
        ps = [params(rows[r]) for r in range(s_rows)]
        scale = np.array([p[0] for p in ps], F32).reshape(s_rows)
        offset = np.array([p[1] for p in ps], F32).reshape(s_rows)
        scale_out = scale.reshape(x32.shape[:-1])
        offset_out = offset.reshape(x32.shape[:-1])
    with np.errstate(all="ignore"):
        v = ((rows / scale[:, None]).astype(F32) + offset[:, None]).astype(F32)  # x' / scale + offset
        r = np.rint(v)
    if dst == "quint4x2":
        y = pack_int4(sat_int(r, -8, 7, np.int64)).reshape(x32.shape[:-1] + (h // 8,))
    else:
        y = sat_int(r, -128, 127, np.int8).reshape(x32.shape)
    return y, scale_out, offset_out


# ---- 5. ActsULQ -----------------------------------------------------------------------------------------------

EPS = F32(1.192092896e-7)


def acts_ulq(x, clamp_min, clamp_max, fixed_min=False, num_bits=8):
    dtype = np.asarray(x).dtype
    x32, cmin, cmax = widen(x), widen(clamp_min), widen(clamp_max)
    levels = F32((1 << num_bits) - 1)
    shape = np.broadcast_shapes(x32.shape, cmin.shape, cmax.shape)
    x32, cmin, cmax = (np.broadcast_to(a, shape) for a in (x32, cmin, cmax))
    with np.errstate(all="ignore"):
        ori_min = np.zeros(shape, F32) if fixed_min else nan_min(cmin, F32(0.0))
        ori_max = nan_max(cmax, F32(levels * EPS))
        s = ((ori_max - ori_min) / levels).astype(F32)
        off = np.rint((ori_min / s).astype(F32))
        clip_lo = (s * off).astype(F32)
        clip_hi = (s * (off + levels).astype(F32)).astype(F32)
        xc = nan_min(nan_max(x32, clip_lo), clip_hi)
        min_mask = x32 >= clip_lo
        max_mask = x32 <= clip_hi
        raw = (xc / s).astype(F32)
        rx = np.rint(raw)
        loss = ((rx - raw).astype(F32) / levels).astype(F32)
        raw_m = (ori_min / s).astype(F32)
        loss_m = ((np.rint(raw_m) - raw_m).astype(F32) / levels).astype(F32)
        xcl = np.where(min_mask & max_mask, loss, loss_m).astype(F32)
        y = (rx * s).astype(F32)
    return (narrow(y, dtype), narrow(min_mask.astype(F32), dtype), narrow(max_mask.astype(F32), dtype),
            narrow(xcl, dtype))


def reduce_to(terms32: np.ndarray, target_shape: tuple, zero=None) -> np.ndarray:
    """Sum float32 terms of the broadcast shape down to target_shape (NumPy broadcasting): each target
    element is the canonical sum of its preimage positions in increasing flat output index; zero (a bool
    array of target_shape) forces 0 where set."""
    out_shape = terms32.shape
    numel = int(np.prod(target_shape, dtype=np.int64))
    padded = (1,) * (len(out_shape) - len(target_shape)) + tuple(target_shape)
    owner = np.broadcast_to(np.arange(numel).reshape(padded), out_shape).reshape(-1)
    flat = terms32.reshape(-1)
    res = np.zeros(numel, F32)
    zflat = None if zero is None else np.asarray(zero).reshape(-1)
    for t in range(numel):
        if zflat is not None and zflat[t]:
            res[t] = F32(0.0)
        else:
            res[t] = canonical_sum(flat[owner == t])
    return res.reshape(target_shape)


def acts_ulq_backward(y_grad, x_shape, clamp_min, clamp_max, min_mask, max_mask, loss, fixed_min=False,
                      num_bits=8):
    dtype = np.asarray(clamp_min).dtype
    dy, m0, m1, ls = widen(y_grad), widen(min_mask), widen(max_mask), widen(loss)
    cmin, cmax = widen(clamp_min), widen(clamp_max)
    levels = F32((1 << num_bits) - 1)
    with np.errstate(all="ignore"):
        t_x = ((dy * m0).astype(F32) * m1).astype(F32)                          # y_grad * min_mask * max_mask
        t_min = (dy * ((F32(1) - m0).astype(F32) - ls).astype(F32)).astype(F32)  # y_grad * ((1 - m0) - loss)
        t_max = (dy * (ls + (F32(1) - m1).astype(F32)).astype(F32)).astype(F32)  # y_grad * (loss + (1 - m1))
    gx = reduce_to(t_x, tuple(x_shape))
    gmin = reduce_to(t_min, cmin.shape, zero=np.full(cmin.shape, True) if fixed_min else cmin > 0)
    gmax = reduce_to(t_max, cmax.shape, zero=cmax < F32(levels * EPS))
    return narrow(gx, dtype), narrow(gmin, dtype), narrow(gmax, dtype)


# ---- comparison --------------------------------------------------------------------------------------------------

def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same(got, want, what: str = "") -> None:
    """Bit-exact equality of dtype, shape and every element; NaN matches NaN (any payload): xquant quiets
    NaNs, NumPy's casts may keep other payload bits."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype.kind == "f" or got.dtype == BF16:
        gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
        assert np.array_equal(gn, wn), f"{what}: NaN positions differ"
        diff = (bits(got) != bits(want)) & ~gn
    else:
        diff = got != want
    if diff.any():
        idx = np.argwhere(diff)[:5]
        detail = ", ".join(f"{tuple(i)}: got {got[tuple(i)]!r} want {want[tuple(i)]!r}" for i in idx)
        raise AssertionError(f"{what}: {int(diff.sum())} of {diff.size} elements differ ({detail})")


# ---- the quantized matmuls (docs/semantics.md section 9) ---------------------------------------------------

def trans_quant_param(scale, offset=None, round_mode=0) -> np.ndarray:
    """int64 words: the scale's float32 bits (truncated, or rounded up in magnitude at bit 12) with the low 13
    bits cleared, flag bit 46, and the offset rint-ed, clamped to [-256, 255], in bits [37, 45]."""
    s = np.asarray(scale, dtype=np.float32)
    b = s.view(np.uint32).astype(np.uint64)
    if round_mode == 1:
        b = (b + np.uint64(0x1000)) & np.uint64(0xFFFFFFFF)
    w = (b & np.uint64(0xFFFFE000)) | np.uint64(1 << 46)
    if offset is not None:
        o = np.asarray(offset, dtype=np.float32)
        r = np.where(np.isnan(o), 0.0, np.clip(np.rint(o.astype(np.float64)), -256, 255)).astype(np.int64)
        w, r = np.broadcast_arrays(w, r)
        w = w | ((r.astype(np.uint64) & np.uint64(0x1FF)) << np.uint64(37))
    return w.astype(np.uint64).view(np.int64)


def _column_params(scale):
    """(s[n], o[n] or None) of npu_quant_matmul's scale: float32 / bfloat16 widened, or an int64 word's float
    bits and 9-bit offset."""
    s = np.asarray(scale)
    if s.dtype == np.int64:
        u = s.view(np.uint64).reshape(-1)
        sv = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
        f = ((u >> np.uint64(37)) & np.uint64(0x1FF)).astype(np.int64)
        return sv, np.where(f >= 256, f - 512, f).astype(np.float32)
    return widen(s).reshape(-1), None


def quant_matmul(x1, x2, scale, offset=None, pertoken_scale=None, bias=None, output_dtype="int8",
                 int4=False, x2_transposed=False) -> np.ndarray:
    """x1 @ x2 in exact integers, then SPEC-style float32 epilogue one operation at a time. x2 is given as
    logical [K, N] (x2_transposed: as stored [N, K]); int4 operands are int32 words, unpacked here."""
    a = unpack_int4(x1) if int4 else np.asarray(x1, dtype=np.int64)
    b = unpack_int4(x2) if int4 else np.asarray(x2, dtype=np.int64)
    if x2_transposed:
        b = np.swapaxes(b, -1, -2)
    acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
    acc = ((acc + 2**31) % 2**32 - 2**31).astype(np.int64)  # int32, modulo 2^32
    if bias is not None and np.asarray(bias).dtype == np.int32:
        acc = ((acc + np.asarray(bias, dtype=np.int64) + 2**31) % 2**32 - 2**31)
    if output_dtype == "int32":
        return acc.astype(np.int32)
    s, o = _column_params(scale)
    v = acc.astype(np.float32) * s  # float32(acc) rounds to nearest even, then one rounded multiply
    if pertoken_scale is not None:
        v = (v * widen(pertoken_scale)[:, None]).astype(np.float32)
    if bias is not None and np.asarray(bias).dtype != np.int32:
        v = (v + widen(bias)).astype(np.float32)
    if offset is not None:
        o = widen(offset).reshape(-1)
    if o is not None:
        v = (v + o).astype(np.float32)
    if output_dtype == "int8":
        return sat_int(np.rint(v), -128, 127, np.int8)
    return narrow(v, BF16 if output_dtype == "bfloat16" else np.dtype(output_dtype))


def quant_matmul_a8w4(x1, x2, scale, group_k, offset=None, pertoken_scale=None, output_dtype="float16",
                      x2_transposed=False) -> np.ndarray:
    """The A8W4 per-group mode: x1 (int8 [M, K]) split as x = 16 * hi + (lo + 8), hi = floor(x / 16),
    lo = (x & 15) - 8; per k group g the exact integer products hi @ w and lo @ w, times scale[g] (float32),
    rounded to float16 and added to float16 running sums (each sum rounded to float16); then, in float32,
    hi_sum * 16 + lo_sum, + offset, * pertoken_scale, and one narrowing to the output dtype."""
    x = np.asarray(x1, dtype=np.int64)
    w = unpack_int4(x2).astype(np.int64)
    if x2_transposed:
        w = w.T
    s, _ = _column_params(scale)
    K, N = w.shape
    s = s.reshape(K // group_k, N)
    hi, lo = np.floor_divide(x, 16), np.bitwise_and(x, 15) - 8
    sums = []
    with np.errstate(over="ignore", invalid="ignore"):  # float16 overflow to Inf and Inf - Inf are specified
        for part in (hi, lo):
            acc16 = np.zeros((x.shape[0], N), dtype=np.float16)
            for g in range(K // group_k):
                ks = slice(g * group_k, (g + 1) * group_k)
                term = (np.matmul(part[:, ks], w[ks]).astype(np.float32) * s[g]).astype(np.float16)
                acc16 = (acc16.astype(np.float32) + term.astype(np.float32)).astype(np.float16)
            sums.append(acc16.astype(np.float32))
        v = (sums[0] * np.float32(16)).astype(np.float32)
        v = (v + sums[1]).astype(np.float32)
        if offset is not None:
            v = (v + widen(offset).reshape(-1)).astype(np.float32)
        if pertoken_scale is not None:
            v = (v * widen(pertoken_scale).reshape(-1, 1)).astype(np.float32)
        return narrow(v, BF16 if output_dtype == "bfloat16" else np.dtype(output_dtype))


def weight_quant_batchmatmul(x, weight, scale, offset=None, bias=None, group_size=0, int4=False,
                             transposed=False) -> np.ndarray:
    """y = narrow(sum over k in increasing order of float32(x) * float32(w) (+ bias)) with
    w = narrow(narrow(q + offset) * scale), all float32 operations rounded one at a time."""
    xd = np.asarray(x).dtype
    q = unpack_int4(weight) if int4 else np.asarray(weight, dtype=np.int64)
    if transposed:
        q = np.swapaxes(q, -1, -2)
    K, N = q.shape
    s = widen(scale)
    s = s.reshape(-1, N) if s.size != 1 else np.full((1, N), s.reshape(-1)[0], np.float32)
    o = None
    if offset is not None:
        o = widen(offset)
        o = o.reshape(-1, N) if o.size != 1 else np.full((1, N), o.reshape(-1)[0], np.float32)
    g = (np.arange(K) // group_size) if group_size else np.zeros(K, dtype=np.int64)
    w = q.astype(np.float32)
    if o is not None:
        w = widen(narrow(w + o[g], xd))
    w = widen(narrow(w * s[g], xd))
    x32 = widen(x).reshape(-1, K)
    acc = np.zeros((x32.shape[0], N), dtype=np.float32)
    for k in range(K):
        acc = (acc + (x32[:, k:k + 1] * w[k]).astype(np.float32)).astype(np.float32)
    if bias is not None:
        acc = (acc + widen(bias).reshape(-1)).astype(np.float32)
    return narrow(acc, xd).reshape(np.asarray(x).shape[:-1] + (N,))
