"""Argument checking shared by the NumPy and torch front ends (no torch import here).

Every message starts with ``xquant::<operator>: `` like the C++ library's, names the argument, what it
got and what was expected.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from . import _core

try:  # NumPy bfloat16 is optional (ml_dtypes)
    import ml_dtypes as _ml_dtypes

    NP_BFLOAT16: np.dtype | None = np.dtype(_ml_dtypes.bfloat16)
    NP_FLOAT8: dict[str, np.dtype] = {"float8_e4m3fn": np.dtype(_ml_dtypes.float8_e4m3fn),
                                      "float8_e5m2": np.dtype(_ml_dtypes.float8_e5m2)}
except ImportError:  # pragma: no cover - exercised only where ml_dtypes is missing
    NP_BFLOAT16 = None
    NP_FLOAT8 = {}

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

QINT8: int = _core.QINT8
QUINT8: int = _core.QUINT8
QINT32: int = _core.QINT32
QUINT4X2: int = _core.QUINT4X2
FLOAT8_E4M3FN: int = _core.FLOAT8_E4M3FN
FLOAT8_E5M2: int = _core.FLOAT8_E5M2

# Spellings of the quantized output kinds accepted for every input kind (torch dtypes are matched by
# name, so that this module never imports torch).
_QDTYPE_NAMES = {
    "qint8": QINT8,
    "int8": QINT8,
    "quint8": QUINT8,
    "uint8": QUINT8,
    "qint32": QINT32,
    "int32": QINT32,
    "quint4x2": QUINT4X2,
    "float8_e4m3fn": FLOAT8_E4M3FN,
    "float8_e5m2": FLOAT8_E5M2,
}
QDTYPE_NAME = {QINT8: "qint8", QUINT8: "quint8", QINT32: "qint32", QUINT4X2: "quint4x2",
               FLOAT8_E4M3FN: "float8_e4m3fn", FLOAT8_E5M2: "float8_e5m2"}

# torch_npu's integer dtype codes (op-plugin 26.x `int? dst_type`): c10::ScalarType values, and torch_npu's own
# codes (>= 256) for the types it adds. The ones torch has a dtype for map to it; the others (hifloat8, int4,
# float4) have no torch tensor to hold them.
NPU_DTYPE_CODES = {1: "int8", 12: "qint8", 16: "quint4x2", 23: "float8_e5m2", 24: "float8_e4m3fn",
                   291: "float8_e5m2", 292: "float8_e4m3fn"}
NPU_DTYPES_WITHOUT_TORCH = {285: "torch_npu.int4", 290: "torch_npu.hifloat8", 293: "torch_npu.float8_e8m0fnu",
                            296: "torch_npu.float4_e2m1fn_x2", 297: "torch_npu.float4_e1m2fn_x2"}
DYNAMIC_DST_NAMES = "int8 (1), quint4x2 (16), float8_e5m2 (23 / 291) or float8_e4m3fn (24 / 292)"


class QuantMode(str, enum.Enum):
    """Mode of the pypto tile ``quant``: SYM (int8 output) or ASYM (uint8 output with an offset)."""

    SYM = "SYM"
    ASYM = "ASYM"


def fail_type(op: str, msg: str) -> TypeError:
    return TypeError(f"xquant::{op}: {msg}")


def fail_value(op: str, msg: str) -> ValueError:
    return ValueError(f"xquant::{op}: {msg}")


def describe(v: Any) -> str:
    r = repr(v)
    if len(r) > 60:
        r = r[:57] + "..."
    if v is None or isinstance(v, (int, float, str)):
        return r
    return f"{r} ({type(v).__module__}.{type(v).__qualname__})"


def as_int(op: str, name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise fail_type(op, f"{name} is {describe(v)} but expected an int")
    v = int(v)
    if not INT64_MIN <= v <= INT64_MAX:
        raise fail_value(op, f"{name} is {v} which does not fit in 64 bits")
    return v


def as_opt_int(op: str, name: str, v: Any) -> int | None:
    return None if v is None else as_int(op, name, v)


def int_triple(op: str, name: str, v: Any) -> tuple[int, int, int]:
    """None -> (0, 0, 0); a list / tuple of three ints (npu_quant_matmul's group_sizes) as given (the
    library checks the values)."""
    if v is None:
        return (0, 0, 0)
    if not isinstance(v, (list, tuple)) or len(v) != 3:
        raise fail_type(op, f"{name} is {describe(v)} but expected None or a list of 3 ints")
    return tuple(as_int(op, f"{name}[{i}]", e) for i, e in enumerate(v))


def as_bool(op: str, name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise fail_type(op, f"{name} is {describe(v)} but expected a bool")
    return bool(v)


def dtype_key(op: str, name: str, d: Any) -> str:
    """A dtype given as a torch dtype, a NumPy dtype (or scalar type) or a name ('int8', 'torch.int8') -> its
    name without 'torch.' ('bfloat16' for ml_dtypes.bfloat16)."""
    t = type(d)
    if isinstance(d, str):
        return d[6:] if d.startswith("torch.") else d
    if t.__module__ == "torch" and t.__name__ == "dtype":
        return str(d)[6:]  # "torch.qint8" -> "qint8"
    if isinstance(d, np.dtype) or (isinstance(d, type) and issubclass(d, np.generic)):
        return np.dtype(d).name
    raise fail_type(op, f"{name} is {describe(d)} but expected a torch dtype, a NumPy dtype or a string")


def quant_dtype_code(op: str, name: str, d: Any) -> int:
    """torch.qint8 / torch.quint8 / torch.qint32 / torch.int32 / torch.quint4x2 (and torch.int8 /
    torch.uint8), NumPy dtypes int8 / uint8 / int32, or the same names as strings -> a QuantDType code."""
    code = _QDTYPE_NAMES.get(dtype_key(op, name, d))
    if code is None:
        raise fail_value(
            op,
            f"{name} is {d} but expected one of torch.qint8, torch.quint8, torch.qint32 / torch.int32, "
            "torch.quint4x2, torch.float8_e4m3fn, torch.float8_e5m2 (NumPy: int8, uint8, int32, ml_dtypes float8; "
            "strings: 'qint8', 'quint8', 'qint32', 'quint4x2', 'float8_e4m3fn', 'float8_e5m2')",
        )
    return code


def storage_of(op: str, code: int) -> np.dtype:
    """The NumPy dtype that stores a quantized output (quint4x2 packs 8 int4 per int32; float8 through
    ml_dtypes)."""
    if code in (FLOAT8_E4M3FN, FLOAT8_E5M2):
        name = QDTYPE_NAME[code]
        if name not in NP_FLOAT8:  # pragma: no cover - exercised only where ml_dtypes is missing
            raise fail_value(op, f"dst_type is {name} but NumPy float8 needs the ml_dtypes package")
        return NP_FLOAT8[name]
    return np.dtype({QINT8: "int8", QUINT8: "uint8", QINT32: "int32", QUINT4X2: "int32"}[code])


def quant_mode(op: str, mode: Any) -> bool:
    """'SYM' / 'ASYM' (or QuantMode) -> asym flag."""
    if isinstance(mode, QuantMode):
        return mode is QuantMode.ASYM
    if not isinstance(mode, str):
        raise fail_type(op, f"mode is {describe(mode)} but expected 'SYM', 'ASYM' or xquant.QuantMode")
    m = mode.upper()
    if m.startswith("QUANTMODE."):
        m = m[10:]
    if m not in ("SYM", "ASYM"):
        raise fail_value(op, f"mode is {mode!r} but expected 'SYM' or 'ASYM'")
    return m == "ASYM"


DYNAMIC_MODES = ("pertoken", "pertensor", "perchannel")


def dynamic_mode(op: str, quant_mode: Any) -> int:
    """'pertoken' / 'pertensor' / 'perchannel' -> 0 / 1 / 2 (xquant::DynamicQuantMode)."""
    if not isinstance(quant_mode, str):
        raise fail_type(op, f"quant_mode is {describe(quant_mode)} but expected 'pertoken', 'pertensor' or "
                            "'perchannel'")
    if quant_mode not in DYNAMIC_MODES:
        raise fail_value(op, f"quant_mode is {quant_mode!r} but expected 'pertoken', 'pertensor' or 'perchannel'")
    return DYNAMIC_MODES.index(quant_mode)


def dst_type_max(op: str, v: Any) -> None:
    """dst_type_max: only 0.0 (on the NPU it sets the range of hifloat8 outputs, which torch lacks)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise fail_type(op, f"dst_type_max is {describe(v)} but expected a float")
    if float(v) != 0.0:
        raise fail_value(op, f"dst_type_max is {v} but expected 0.0: the NPU applies it to hifloat8 outputs only, "
                             "which torch (and xquant) lack; int8 / int4 / float8 use their own maximum")


def dynamic_dst_name(op: str, dst_type: Any) -> Any:
    """The dynamic quantizations' dst_type as torch_npu takes it: an integer dtype code (op-plugin 26.x
    ``int? dst_type``) -> the name of its dtype; anything else unchanged (dtypes and names are checked
    later). torch_npu types torch has no tensor for (hifloat8, int4, float4) are a clear ValueError."""
    if isinstance(dst_type, bool) or not isinstance(dst_type, (int, np.integer)):
        return dst_type
    code = int(dst_type)
    if code in NPU_DTYPES_WITHOUT_TORCH:
        raise fail_value(op, f"dst_type is {code} ({NPU_DTYPES_WITHOUT_TORCH[code]}) but torch has no dtype to hold "
                             f"it, so xquant cannot produce it; expected {DYNAMIC_DST_NAMES}")
    name = NPU_DTYPE_CODES.get(code)
    if name is None:
        raise fail_value(op, f"dst_type is {code} but expected a dtype code of {DYNAMIC_DST_NAMES}, or a torch dtype")
    return name


def dst_type_code(op: str, dst_type: Any) -> int:
    """The dynamic quantizations' dst_type: None -> qint8; integer codes as torch_npu's."""
    return QINT8 if dst_type is None else quant_dtype_code(op, "dst_type", dynamic_dst_name(op, dst_type))


def src_dtype_code(op: str, src_dtype: Any) -> int:
    """npu_anti_quant's src_dtype: None -> qint8."""
    return QINT8 if src_dtype is None else quant_dtype_code(op, "src_dtype", src_dtype)


FLOAT_DTYPES = ("float16", "bfloat16", "float32")


def float_dtype_name(op: str, name: str, d: Any) -> str:
    """npu_anti_quant's dst_dtype: None -> 'float16'; torch.float16 / torch.bfloat16 / torch.float32, NumPy
    float16 / float32 / ml_dtypes.bfloat16, or those names as strings -> the name."""
    if d is None:
        return "float16"
    key = dtype_key(op, name, d)
    if key not in FLOAT_DTYPES:
        raise fail_value(op, f"{name} is {d} but expected float16, bfloat16 or float32")
    return key


def dequantized_shape(shape: tuple, code: int) -> tuple:
    """Output shape of npu_anti_quant: x's logical shape (quint4x2 multiplies the last dimension by 8).
    Lenient, as quantized_shape."""
    if code == QUINT4X2 and len(shape) >= 1:
        return tuple(shape[:-1]) + (shape[-1] * 8,)
    return tuple(shape)


def quantized_shape(shape: tuple, code: int) -> tuple:
    """Output shape of a quantizing operator: quint4x2 divides the last dimension by 8. Lenient: for an
    invalid input the C++ library raises its own error before it looks at the output."""
    if code == QUINT4X2 and len(shape) >= 1:
        return tuple(shape[:-1]) + (shape[-1] // 8,)
    return tuple(shape)


def dynamic_shapes(shape: tuple, code: int, mode: int) -> tuple[tuple, tuple]:
    """(y shape, scale / offset shape) of the dynamic quantizations (lenient, as quantized_shape): pertoken
    x.shape[:-1], pertensor (1,), perchannel x.shape[:-2] + (H,)."""
    y = quantized_shape(shape, code)
    if mode == 1:
        params = (1,)
    elif mode == 2 and len(shape) >= 2:
        params = tuple(shape[:-2]) + (shape[-1],)
    else:
        params = tuple(shape[:-1])
    return y, params


MATMUL_OUT_DTYPES = ("int8", "float16", "bfloat16", "int32")


def matmul_out_name(op: str, d: Any) -> str:
    """npu_quant_matmul's output_dtype: None -> 'int8'; int8 / float16 / bfloat16 / int32 as torch or NumPy
    dtypes or names -> the name."""
    if d is None:
        return "int8"
    key = dtype_key(op, "output_dtype", d)
    if key not in MATMUL_OUT_DTYPES:
        raise fail_value(op, f"output_dtype is {key} but expected None (int8), int8, float16, bfloat16 or int32")
    return key


def same_dtype(op: str, name: str, d: Any, main: str, main_name: str) -> None:
    """torch_npu's optional dtype re-interpretation keywords (x1_dtype, weight_dtype, ...): None, or the dtype
    the tensor already has (torch.quint4x2 for int32 words of eight int4). Others name the Ascend 950
    formats (float8, HiFloat8, MX), which xquant does not implement."""
    if d is None:
        return
    key = dtype_key(op, name, d)
    if key == main or (main == "int32" and key == "quint4x2") or (main == "int8" and key == "qint8"):
        return
    raise fail_value(op, f"{name} is {key} but {main_name} has dtype {main}; xquant reads int8, or int32 words of eight "
                         f"int4, as stored (expected {name}=None; the float8 / HiFloat8 / MX re-interpretations "
                         "of the Ascend 950 are not implemented)")

