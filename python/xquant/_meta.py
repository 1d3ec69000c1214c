"""Shape / dtype / argument validation without data, for the fake (meta) implementations of the torch
custom operators: meta tensors and FakeTensors (torch.compile, torch.export) get the errors a real call
gets, with the same types and messages (xquant::Error's dtype_mismatch -> TypeError, the rest ->
ValueError). These functions mirror the C++ library's checks in the order it makes them; only the checks
that read values (amax finite and >= 0, group_index row ends, aliasing of buffers) need data and are left
to the real call. tests/python/test_meta_errors.py compares every case with the real call.

Arguments are (dtype name, shape tuple) pairs: ``T = tuple[str, tuple[int, ...]]``.
"""

from __future__ import annotations

from typing import Optional

from ._args import QDTYPE_NAME, QINT8, QINT32, QUINT4X2, QUINT8, fail_type, fail_value

T = tuple  # (dtype name, shape)
_FLOATING = ("float32", "float16", "bfloat16")


def shape_str(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def to_int(op: str, name: str, v: int) -> int:
    """The binding's conversion of an int argument to C++ int."""
    if not -(2**31) <= v < 2**31:
        raise fail_value(op, f"{name} is {v} which does not fit in 32 bits")
    return v


def check_floating(op: str, name: str, dt: str) -> None:
    if dt not in _FLOATING:
        raise fail_type(op, f"{name} has dtype {dt} but expected float32, float16 or bfloat16")


def check_dtype(op: str, name: str, got: str, expected: str) -> None:
    if got != expected:
        raise fail_type(op, f"{name} has dtype {got} but expected {expected}")


def check_shape(op: str, name: str, got, expected, what: str) -> None:
    if tuple(got) != tuple(expected):
        raise fail_value(op, f"{name} has shape {shape_str(got)} but expected {shape_str(expected)} ({what})")


def normalize_axis(op: str, name: str, axis: int, rank: int) -> int:
    if axis < -rank or axis >= rank:
        raise fail_value(op, f"{name} is {axis} but expected a value in [{-rank}, {rank - 1}] for a tensor of "
                             f"rank {rank}")
    return axis + rank if axis < 0 else axis


def check_num_bits(op: str, num_bits: int, lo: int, hi: int) -> None:
    if not lo <= num_bits <= hi:
        raise fail_value(op, f"num_bits is {num_bits} but expected a value in [{lo}, {hi}]")


# ---- fake tensor quant ------------------------------------------------------------------------------------

def fake_quant(op: str, inputs: T, amax: T, axis: Optional[int], num_bits: int) -> None:
    """src/ops/fake_quant.cpp plan() without the amax values."""
    to_int(op, "num_bits", num_bits)
    (xdt, xs), (adt, ash) = inputs, amax
    check_floating(op, "inputs", xdt)
    check_floating(op, "amax", adt)
    check_num_bits(op, num_bits, 1, 32)
    if axis is None:
        if _numel(ash) != 1:
            raise fail_value(op, f"amax has shape {shape_str(ash)} ({_numel(ash)} elements) but expected exactly "
                                 "one element for per-tensor quantization")
    else:
        ax = normalize_axis(op, "axis", axis, len(xs))
        if len(ash) != 1 or ash[0] != xs[ax]:
            raise fail_value(op, f"amax has shape {shape_str(ash)} but inputs has {int(xs[ax])} channels on axis "
                                 f"{ax} (expected a 1-D amax of that length)")


def fake_quant_backward(grad_out: T, inputs: T, amax: T, axis: Optional[int], num_bits: int) -> None:
    op = "fake_tensor_quant_backward"
    fake_quant(op, inputs, amax, axis, num_bits)
    check_dtype(op, "grad_out", grad_out[0], inputs[0])
    check_shape(op, "grad_out", grad_out[1], inputs[1], "the shape of inputs")


# ---- npu_quantize -------------------------------------------------------------------------------------------

def quantize(input: T, scales: T, zero_points: Optional[T], code: int, axis: int, div_mode: bool) -> tuple:
    """src/ops/quantize.cpp make_plan() + quantize_output_shape(); returns the output shape."""
    op = "quantize"
    (xdt, xs), (sdt, ss) = input, scales
    check_floating(op, "input", xdt)
    name = QDTYPE_NAME[code]
    if div_mode and code not in (QINT8, QUINT8, QINT32):
        raise fail_value(op, f"dtype is {name} but div_mode=true expects qint8, quint8 or qint32")
    if not div_mode and code not in (QINT8, QUINT4X2):
        raise fail_value(op, f"dtype is {name} but div_mode=false expects qint8 or quint4x2")
    check_floating(op, "scales", sdt)
    rank = len(xs)
    if div_mode:
        if len(ss) != 1:
            raise fail_value(op, f"scales has shape {shape_str(ss)} but expected a 1-D tensor with 1 element "
                                 "(per-tensor) or input.shape[axis] elements")
        if ss[0] != 1:
            a = normalize_axis(op, "axis", axis, rank)
            if ss[0] != xs[a]:
                n = int(xs[a])
                raise fail_value(op, f"scales has shape {shape_str(ss)} but input has {n} channels on axis {a} "
                                     f"(expected 1 or {n} elements)")
    else:
        if rank < 1:
            raise fail_value(op, f"input has shape {shape_str(xs)} but div_mode=false expects a tensor of rank >= 1")
        if axis < -2:
            raise fail_value(op, f"axis is {axis} but div_mode=false expects axis >= -2 (-2: the second-to-last "
                                 "dimension, > -2: the last one)")
        if axis >= rank:
            raise fail_value(op, f"axis is {axis} but expected a value below the input's rank {rank}")
        if axis == -2 and rank < 2:
            raise fail_value(op, f"axis is -2 (the second-to-last dimension) but input has rank {rank}")
        d = rank - 2 if axis == -2 else rank - 1
        n = int(xs[d])
        ok = False
        if len(ss) == 1:
            ok = ss[0] in (1, n)
        elif len(ss) == rank:
            ok = ss[d] in (1, n) and all(ss[i] == 1 for i in range(rank) if i != d)
        if not ok:
            raise fail_value(op, f"scales has shape {shape_str(ss)} but input has {n} channels on axis {d} "
                                 f"(expected 1 or {n} elements, as a 1-D tensor or a rank-{rank} tensor whose other "
                                 "dimensions are 1)")
    if zero_points is not None:
        zdt, zs = zero_points
        if div_mode:
            if zdt not in ("int8", "uint8", "int32") + _FLOATING:
                raise fail_type(op, f"zero_points has dtype {zdt} but expected int8, uint8, int32, float32, float16 "
                                    "or bfloat16")
        elif zdt != sdt:
            raise fail_type(op, f"zero_points has dtype {zdt} but expected {sdt} (the dtype of scales)")
        check_shape(op, "zero_points", zs, ss, "the shape of scales")
    if code != QUINT4X2:
        return tuple(xs)
    if rank == 0 or xs[-1] % 8 != 0:
        raise fail_value(op, f"input has shape {shape_str(xs)} but dtype quint4x2 expects a last dimension "
                             "divisible by 8 (eight int4 per int32)")
    return tuple(xs[:-1]) + (xs[-1] // 8,)


# ---- pypto tile quant ---------------------------------------------------------------------------------------

def tile_quant(out: T, src: T, scale: T, asym: bool, offset: Optional[T]) -> None:
    """The binding's 2-D checks (out, src, scale, offset), then src/ops/tile_quant.cpp (dense tiles: the row
    pitch equals the column count)."""
    op = "tile_quant"
    for name, t in (("out", out), ("src", src), ("scale", scale), ("offset", offset)):
        if t is not None and len(t[1]) != 2:
            raise fail_value(op, f"{name} has shape {shape_str(t[1])} but expected a 2-D tile")

    def tile(name: str, t: T, dtype: str, expected: Optional[tuple]) -> None:
        check_dtype(op, name, t[0], dtype)
        rows, cols = (int(d) for d in t[1])
        if expected is not None and (rows, cols) != expected[:2]:
            raise fail_value(op, f"{name} has valid shape {shape_str((rows, cols))} but expected "
                                 f"{shape_str(expected[:2])} ({expected[2]})")

    m, n = (int(d) for d in src[1])
    tile("src", src, "float32", None)
    tile("scale", scale, "float32", (m, 1, "one value per row of src"))
    if not asym:
        if offset is not None:
            raise fail_value(op, "offset is given but mode SYM takes no offset")
    else:
        if offset is None:
            raise fail_value(op, "offset is missing but mode ASYM requires it")
        sr, sc = (int(d) for d in scale[1])
        tile("offset", offset, "float32", (sr, sc, "the valid shape of scale"))
    tile("out", out, "uint8" if asym else "int8", (m, n, "the valid shape of src"))


# ---- npu_dynamic_quant_asymmetric ---------------------------------------------------------------------------

def dynamic_quant(x: T, smooth_scales: Optional[T], group_index: Optional[T], code: int,
                  per_tensor: bool) -> tuple[tuple, tuple]:
    """src/ops/dynamic_quant.cpp validate_inputs() without the group_index values; returns the (y, scale /
    offset) shapes."""
    op = "dynamic_quant_asymmetric"
    xdt, xs = x
    check_floating(op, "x", xdt)
    if len(xs) < 2:
        raise fail_value(op, f"x has shape {shape_str(xs)} (rank {len(xs)}) but expected rank >= 2")
    if code not in (QINT8, QUINT4X2):
        raise fail_value(op, f"dst_type is {QDTYPE_NAME[code]} but expected qint8 or quint4x2")
    h = int(xs[-1])
    y_shape = tuple(xs)
    if code == QUINT4X2:
        if h % 8 != 0:
            raise fail_value(op, f"x has shape {shape_str(xs)} whose last dimension {h} is not a multiple of 8, but "
                                 "expected a multiple of 8 for dst_type quint4x2")
        y_shape = tuple(xs[:-1]) + (xs[-1] // 8,)
    p_shape = (1,) if per_tensor else tuple(xs[:-1])
    if group_index is not None and smooth_scales is None:
        raise fail_value(op, "group_index is given without smooth_scales but expected smooth_scales [E, H] with it")
    if smooth_scales is not None and per_tensor:
        raise fail_value(op, "quant_mode is pertensor with smooth_scales but expected pertoken (smooth_scales "
                             "supports only pertoken)")
    if smooth_scales is not None:
        sdt, ss = smooth_scales
        check_floating(op, "smooth_scales", sdt)
        if group_index is None:
            if len(ss) != 1:
                raise fail_value(op, f"smooth_scales has shape {shape_str(ss)} but expected [{h}] (1-D, the last "
                                     "dimension of x; 2-D [E, H] needs group_index)")
            check_shape(op, "smooth_scales", ss, (h,), "the last dimension of x")
        else:
            if len(ss) != 2:
                raise fail_value(op, f"smooth_scales has shape {shape_str(ss)} but expected [E, {h}] (2-D, one row "
                                     "per expert, because group_index is given)")
            if ss[1] != h:
                raise fail_value(op, f"smooth_scales has shape {shape_str(ss)} but expected [E, {h}] (its last "
                                     "dimension must equal the last dimension of x)")
    if group_index is not None:
        gdt, gs = group_index
        if gdt not in ("int32", "int64"):
            raise fail_type(op, f"group_index has dtype {gdt} but expected int32 or int64")
        experts = int(smooth_scales[1][0])
        check_shape(op, "group_index", gs, (experts,), "E, the first dimension of smooth_scales")
        if experts < 1:
            raise fail_value(op, f"group_index has shape {shape_str(gs)} but expected at least 1 expert")
    return y_shape, p_shape


# ---- ActsULQ ------------------------------------------------------------------------------------------------

_MAX_RANK = 8


def _broadcast_into(op: str, name: str, shape: tuple, acc: tuple, acc_what: str) -> tuple:
    rank = max(len(acc), len(shape))
    out = []
    for i in range(rank):  # from the right
        da = acc[len(acc) - 1 - i] if i < len(acc) else 1
        db = shape[len(shape) - 1 - i] if i < len(shape) else 1
        if da != db and da != 1 and db != 1:
            raise fail_value(op, f"{name} has shape {shape_str(shape)} which does not broadcast with {acc_what} "
                                 f"{shape_str(acc)}")
        out.append(db if da == 1 else da)
    return tuple(reversed(out))


def broadcast_three(op: str, x_name: str, x: tuple, lo: tuple, hi: tuple, x_first: bool) -> tuple:
    """src/ops/acts_ulq.cpp broadcast_three() (the element-count overflow check cannot fail for torch
    tensors)."""
    for name, s in ((x_name, x), ("clamp_min", lo), ("clamp_max", hi)):
        if len(s) > _MAX_RANK:
            raise fail_value(op, f"{name} has shape {shape_str(s)} of rank {len(s)} but expected a rank of at most "
                                 f"{_MAX_RANK}")
    if x_first:
        acc = _broadcast_into(op, "clamp_min", lo, x, f"{x_name}'s shape")
        _broadcast_into(op, "clamp_max", hi, x, f"{x_name}'s shape")
        _broadcast_into(op, "clamp_max", hi, lo, "clamp_min's shape")
        return _broadcast_into(op, "clamp_max", hi, acc, f"the broadcast shape of {x_name} and clamp_min")
    acc = _broadcast_into(op, "clamp_max", hi, lo, "clamp_min's shape")
    _broadcast_into(op, x_name, x, lo, "clamp_min's shape")
    _broadcast_into(op, x_name, x, hi, "clamp_max's shape")
    return _broadcast_into(op, x_name, x, acc, "the broadcast shape of clamp_min and clamp_max")


def acts_ulq(x: T, clamp_min: T, clamp_max: T, num_bits: int) -> tuple:
    """src/ops/acts_ulq.cpp validate_forward_inputs(); returns the output shape."""
    op = "acts_ulq"
    to_int(op, "num_bits", num_bits)
    check_floating(op, "x", x[0])
    check_dtype(op, "clamp_min", clamp_min[0], x[0])
    check_dtype(op, "clamp_max", clamp_max[0], x[0])
    out = broadcast_three(op, "x", tuple(x[1]), tuple(clamp_min[1]), tuple(clamp_max[1]), True)
    check_num_bits(op, num_bits, 2, 16)
    return out


def acts_ulq_backward(y_grad: T, x_shape: tuple, clamp_min: T, clamp_max: T, clamp_min_mask: T,
                      clamp_max_mask: T, x_clamped_loss: T, num_bits: int) -> None:
    """src/ops/acts_ulq.cpp validate_backward_inputs() as the out-variant makes them (x's shape carried by
    x_grad, which the custom operator allocates from x_shape)."""
    op = "acts_ulq_backward"
    to_int(op, "num_bits", num_bits)
    check_floating(op, "clamp_min", clamp_min[0])
    dt = clamp_min[0]
    for name, t in (("clamp_max", clamp_max), ("y_grad", y_grad), ("clamp_min_mask", clamp_min_mask),
                    ("clamp_max_mask", clamp_max_mask), ("x_clamped_loss", x_clamped_loss)):
        check_dtype(op, name, t[0], dt)
    out = broadcast_three(op, "x_grad", tuple(x_shape), tuple(clamp_min[1]), tuple(clamp_max[1]), False)
    what = "the broadcast shape of x, clamp_min and clamp_max"
    for name, t in (("y_grad", y_grad), ("clamp_min_mask", clamp_min_mask), ("clamp_max_mask", clamp_max_mask),
                    ("x_clamped_loss", x_clamped_loss)):
        check_shape(op, name, t[1], out, what)
    check_num_bits(op, num_bits, 2, 16)
