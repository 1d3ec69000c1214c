"""NumPy front end: prepares arrays (zero-copy when already dense), allocates NumPy outputs and calls the
compiled core. bfloat16 arrays (ml_dtypes) travel to C++ as uint16 views of the same memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _args, _core
from ._args import NP_BFLOAT16, fail_type, fail_value

_UINT16 = np.dtype(np.uint16)
# The dtypes the C++ library reads (bfloat16 through ml_dtypes), native byte order.
_SUPPORTED = {np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int32, np.int64)}
if NP_BFLOAT16 is not None:
    _SUPPORTED.add(NP_BFLOAT16)


def _raw(a: np.ndarray) -> np.ndarray:
    """The array as C++ sees it: bfloat16 as uint16 bits (same memory)."""
    return a.view(np.uint16) if NP_BFLOAT16 is not None and a.dtype == NP_BFLOAT16 else a


def _check_array(op: str, name: str, a: Any) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise fail_type(op, f"{name} is {_args.describe(a)} but expected a numpy.ndarray (the kind of the main input)")
    if isinstance(a, np.ma.MaskedArray):
        # Computing on the data would silently drop the mask; xquant has no masked semantics.
        raise fail_type(op, f"{name} is a masked array (numpy.ma.MaskedArray) but expected a plain numpy.ndarray "
                            "(xquant has no masked semantics: pass a.filled(value) or a.data explicitly)")
    dt = a.dtype
    if dt not in _SUPPORTED and (dt.isnative or dt.newbyteorder("=") not in _SUPPORTED):
        shown = dt.newbyteorder("=").name if dt.fields is None and dt.kind != "O" else str(dt)
        raise fail_type(op, f"{name} has dtype {shown} which xquant does not support "
                            "(float32, float16, bfloat16, int8, uint8, int32, int64)")
    return a


def arg(op: str, name: str, a: Any) -> np.ndarray:
    """An input: made dense, aligned and native-endian if it is not (a copy only then)."""
    a = _check_array(op, name, a)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if not (a.flags.c_contiguous and a.flags.aligned):
        a = a.copy(order="C")
    return _raw(a)


def opt_arg(op: str, name: str, a: Any) -> np.ndarray | None:
    return None if a is None else arg(op, name, a)


def param_array(op: str, name: str, v: Any, dtype: np.dtype) -> np.ndarray:
    """A parameter tensor that may also be given as a Python / NumPy real number (-> 0-d array of dtype),
    in the caller's dtype (not yet prepared for C++)."""
    if isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return np.asarray(v, dtype=dtype)
    return _check_array(op, name, v)


def param(op: str, name: str, v: Any, dtype: np.dtype) -> np.ndarray:
    return arg(op, name, param_array(op, name, v, dtype))


def output(op: str, name: str, a: Any) -> np.ndarray:
    """An array written in place: must already be dense, aligned, native and writable (never copied)."""
    a = _check_array(op, name, a)
    if not a.flags.writeable:
        raise fail_value(op, f"{name} is a read-only array but expected a writable one")
    if not (a.flags.c_contiguous and a.flags.aligned and a.dtype.isnative):
        raise fail_value(
            op,
            f"{name} is not a dense (C-contiguous, aligned, native-endian) array; an in-place call cannot make it "
            "contiguous for you (pass np.ascontiguousarray(...) and use the result)",
        )
    return _raw(a)


def _empty(shape: tuple, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(array returned to the caller, the same memory as C++ sees it); results are native-endian."""
    dtype = np.dtype(dtype)
    a = np.empty(shape, dtype=dtype if dtype.isnative else dtype.newbyteorder("="))
    return a, _raw(a)


# ---- fake tensor quant ------------------------------------------------------------------------------------

def fake_tensor_quant(op: str, inputs: np.ndarray, amax: Any, axis: int | None, num_bits: int, is_unsigned: bool,
                      narrow_range: bool) -> np.ndarray:
    x = arg(op, "inputs", inputs)
    a = param(op, "amax", amax, np.dtype(np.float32))
    out, raw = _empty(x.shape, inputs.dtype)
    _core.fake_tensor_quant(raw, x, a, axis, num_bits, is_unsigned, narrow_range)
    return out


def fake_tensor_quant_inplace(op: str, inputs: np.ndarray, amax: Any, num_bits: int, is_unsigned: bool,
                              narrow_range: bool) -> np.ndarray:
    x = output(op, "inputs", inputs)
    a = param(op, "amax", amax, np.dtype(np.float32))
    _core.fake_tensor_quant_inplace(x, a, num_bits, is_unsigned, narrow_range)
    return inputs


def fake_tensor_quant_backward(op: str, grad_out: np.ndarray, inputs: np.ndarray, amax: Any, axis: int | None,
                               num_bits: int, is_unsigned: bool, narrow_range: bool,
                               want_grad_amax: bool) -> tuple[np.ndarray, np.ndarray | None]:
    g = arg(op, "grad_out", grad_out)
    x = arg(op, "inputs", inputs)
    amax_arr = param_array(op, "amax", amax, np.dtype(np.float32))
    a = arg(op, "amax", amax_arr)
    gi, gi_raw = _empty(x.shape, inputs.dtype)
    ga, ga_raw = _empty(a.shape, amax_arr.dtype) if want_grad_amax else (None, None)
    _core.fake_tensor_quant_backward(gi_raw, ga_raw, g, x, a, axis, num_bits, is_unsigned, narrow_range)
    return gi, ga


# ---- npu_quantize -------------------------------------------------------------------------------------------

def quantize(op: str, input: np.ndarray, scales: Any, zero_points: Any, dtype: Any, axis: int,
             div_mode: bool) -> np.ndarray:
    code = _args.quant_dtype_code(op, "dtype", dtype)
    x = arg(op, "input", input)
    s = arg(op, "scales", scales)
    zp = opt_arg(op, "zero_points", zero_points)
    out = np.empty(_args.quantized_shape(x.shape, code), dtype=_args.storage_of(op, code))
    _core.quantize(out, x, s, zp, code, axis, div_mode)
    return out


# ---- pypto tile quant -------------------------------------------------------------------------------------

def _tile_pitch_ok(a: np.ndarray) -> bool:
    """Row-major rows with unit column stride, possibly padded (a slice of a wider array)."""
    if a.ndim != 2 or a.size == 0:
        return True  # not 2-D: C++ reports the shape; empty: nothing is read or written
    if not a.flags.aligned or not a.dtype.isnative:
        return False
    rows, cols = a.shape
    s0, s1 = a.strides
    item = a.itemsize
    return (cols <= 1 or s1 == item) and (rows <= 1 or (s0 >= 0 and s0 % item == 0))


def _tile_in(op: str, name: str, a: Any) -> np.ndarray:
    a = _check_array(op, name, a)
    if not _tile_pitch_ok(a):
        a = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("="), copy=False))
    return _raw(a)


def tile_quant(op: str, out: Any, src: Any, scale: Any, mode: Any, offset: Any) -> None:
    asym = _args.quant_mode(op, mode)
    o = _check_array(op, "out", out)
    if not o.flags.writeable:
        raise fail_value(op, "out is a read-only array but expected a writable one")
    if not _tile_pitch_ok(o):
        raise fail_value(
            op, "out must be a 2-D row-major array with unit column stride (rows may be padded); it is written in place"
        )
    s = _tile_in(op, "src", src)
    sc = _tile_in(op, "scale", scale)
    off = None if offset is None else _tile_in(op, "offset", offset)
    if off is not None and sc.ndim == 2 and off.ndim == 2 and sc.strides[0] != off.strides[0]:
        # The NPU needs scale and offset in tiles of one physical shape; off the NPU, give both a dense layout.
        sc, off = np.ascontiguousarray(sc), np.ascontiguousarray(off)
    _core.tile_quant(o, s, sc, asym, off)


# ---- npu_dynamic_quant_asymmetric --------------------------------------------------------------------------

def _y_raw(y: np.ndarray) -> np.ndarray:
    """A float8 output as C++ sees it: uint8 bits (same memory; the core tags it with dst_type's dtype)."""
    return y.view(np.uint8) if y.dtype.name.startswith("float8") else y


def _dynamic(op: str, symmetric: bool, x: Any, smooth_scales: Any, group_index: Any, dst_type: Any,
             quant_mode: str, dst_type_max: Any) -> tuple:
    """Both dynamic quantizations: (y, scale) for the symmetric one, (y, scale, offset) otherwise."""
    code = _args.dst_type_code(op, dst_type)
    mode = _args.dynamic_mode(op, quant_mode)
    _args.dst_type_max(op, dst_type_max)
    xv = arg(op, "x", x)
    sm = opt_arg(op, "smooth_scales", smooth_scales)
    gi = opt_arg(op, "group_index", group_index)
    y_shape, p_shape = _args.dynamic_shapes(xv.shape, code, mode)
    y = np.empty(y_shape, dtype=_args.storage_of(op, code))
    scale = np.empty(p_shape, dtype=np.float32)
    if symmetric:
        _core.dynamic_quant(_y_raw(y), scale, xv, sm, gi, code, mode)
        return y, scale
    offset = np.empty(p_shape, dtype=np.float32)
    _core.dynamic_quant_asymmetric(_y_raw(y), scale, offset, xv, sm, gi, code, mode)
    return y, scale, offset


def dynamic_quant_asymmetric(op: str, x: Any, smooth_scales: Any, group_index: Any, dst_type: Any,
                             quant_mode: str, dst_type_max: Any = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _dynamic(op, False, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max)


# ---- npu_dynamic_quant (symmetric) -----------------------------------------------------------------------

def dynamic_quant(op: str, x: Any, smooth_scales: Any, group_index: Any, dst_type: Any,
                  quant_mode: str = "pertoken", dst_type_max: Any = 0.0) -> tuple[np.ndarray, np.ndarray]:
    return _dynamic(op, True, x, smooth_scales, group_index, dst_type, quant_mode, dst_type_max)


# ---- npu_anti_quant -----------------------------------------------------------------------------------------

def anti_quant(op: str, x: Any, scale: Any, offset: Any, dst_dtype: Any, src_dtype: Any) -> np.ndarray:
    dst = _args.float_dtype_name(op, "dst_dtype", dst_dtype)
    if dst == "bfloat16" and NP_BFLOAT16 is None:  # pragma: no cover - exercised only where ml_dtypes is missing
        raise fail_value(op, "dst_dtype is bfloat16 but NumPy bfloat16 needs the ml_dtypes package")
    code = _args.src_dtype_code(op, src_dtype)
    xv = arg(op, "x", x)
    s = arg(op, "scale", scale)
    off = opt_arg(op, "offset", offset)
    out, raw = _empty(_args.dequantized_shape(xv.shape, code), NP_BFLOAT16 if dst == "bfloat16" else np.dtype(dst))
    _core.anti_quant(raw, xv, s, off, code)
    return out


# ---- ActsULQ ------------------------------------------------------------------------------------------------

def _broadcast(*shapes: tuple) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return tuple(shapes[0])  # the C++ library reports the mismatch, naming the argument


def acts_ulq(op: str, x: Any, clamp_min: Any, clamp_max: Any, fixed_min: bool,
             num_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    xv = arg(op, "x", x)
    lo = param(op, "clamp_min", clamp_min, x.dtype)
    hi = param(op, "clamp_max", clamp_max, x.dtype)
    shape = _broadcast(xv.shape, lo.shape, hi.shape)
    outs = [_empty(shape, x.dtype) for _ in range(4)]
    _core.acts_ulq(*(r for _, r in outs), xv, lo, hi, fixed_min, num_bits)
    return tuple(o for o, _ in outs)  # type: ignore[return-value]


def acts_ulq_backward(op: str, y_grad: Any, x_shape: tuple, clamp_min: Any, clamp_max: Any, clamp_min_mask: Any,
                      clamp_max_mask: Any, x_clamped_loss: Any, fixed_min: bool,
                      num_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dy = arg(op, "y_grad", y_grad)
    lo = arg(op, "clamp_min", clamp_min)
    hi = arg(op, "clamp_max", clamp_max)
    m0 = arg(op, "clamp_min_mask", clamp_min_mask)
    m1 = arg(op, "clamp_max_mask", clamp_max_mask)
    ls = arg(op, "x_clamped_loss", x_clamped_loss)
    dt = clamp_min.dtype
    xg, xg_raw = _empty(tuple(x_shape), dt)
    g0, g0_raw = _empty(lo.shape, dt)
    g1, g1_raw = _empty(hi.shape, dt)
    _core.acts_ulq_backward(xg_raw, g0_raw, g1_raw, dy, lo, hi, m0, m1, ls, fixed_min, num_bits)
    return xg, g0, g1


# ---- the quantized matmuls -------------------------------------------------------------------------------------

def _matrix(op: str, name: str, a: Any) -> tuple[np.ndarray, bool]:
    """A matrix operand: the transposed view of a dense [..., N, K] array is passed as that storage with the
    library's transpose flag (no copy); anything else as arg() prepares it."""
    a = _check_array(op, name, a)
    if a.ndim >= 2 and not a.flags.c_contiguous:
        t = np.swapaxes(a, -1, -2)
        if t.flags.c_contiguous and t.flags.aligned and t.dtype.isnative:
            return _raw(t), True
    return arg(op, name, a), False


def _out_dtype(op: str, name: str) -> np.dtype:
    if name == "bfloat16":
        if NP_BFLOAT16 is None:  # pragma: no cover - exercised only where ml_dtypes is missing
            raise fail_value(op, "output_dtype is bfloat16 but NumPy bfloat16 needs the ml_dtypes package")
        return NP_BFLOAT16
    return np.dtype(name)


def quant_matmul(op: str, x1: Any, x2: Any, scale: Any, offset: Any, pertoken_scale: Any, bias: Any,
                 output_dtype: str, group_sizes: tuple = (0, 0, 0)) -> np.ndarray:
    a = arg(op, "x1", x1)
    w, transposed = _matrix(op, "x2", x2)
    s, off, pts, b = (arg(op, "scale", scale), opt_arg(op, "offset", offset),
                      opt_arg(op, "pertoken_scale", pertoken_scale), opt_arg(op, "bias", bias))
    shape = _core.quant_matmul_shape(a, w, s, off, pts, b, transposed, output_dtype, group_sizes)
    out, raw = _empty(tuple(shape), _out_dtype(op, output_dtype))
    _core.quant_matmul(raw, a, w, s, off, pts, b, transposed, group_sizes)
    return out


def weight_quant_batchmatmul(op: str, x: Any, weight: Any, antiquant_scale: Any, antiquant_offset: Any, bias: Any,
                             antiquant_group_size: int) -> np.ndarray:
    xv = arg(op, "x", x)
    w, transposed = _matrix(op, "weight", weight)
    s, off, b = (arg(op, "antiquant_scale", antiquant_scale), opt_arg(op, "antiquant_offset", antiquant_offset),
                 opt_arg(op, "bias", bias))
    shape = _core.weight_quant_batchmatmul_shape(xv, w, s, off, b, antiquant_group_size, transposed)
    out, raw = _empty(tuple(shape), x.dtype)
    _core.weight_quant_batchmatmul(raw, xv, w, s, off, b, antiquant_group_size, transposed)
    return out


def trans_quant_param(op: str, scale: Any, offset: Any, round_mode: int) -> np.ndarray:
    s, off = arg(op, "scale", scale), opt_arg(op, "offset", offset)
    out = np.empty(tuple(_core.trans_quant_param_shape(s, off, round_mode)), dtype=np.int64)
    _core.trans_quant_param(out, s, off, round_mode)
    return out


def convert_weight_to_int4pack(op: str, weight: Any) -> np.ndarray:
    w = arg(op, "weight", weight)
    out = np.empty(tuple(_core.convert_weight_to_int4pack_shape(w)), dtype=np.int32)
    _core.convert_weight_to_int4pack(out, w)
    return out
