"""TEMPORARY pure-PyTorch fallbacks for npu_dynamic_quant (SPEC section 6) and npu_anti_quant (SPEC 7).

The stand-in calls ``xquant.npu.npu_dynamic_quant`` / ``xquant.npu.npu_anti_quant`` (the C++ kernels)
when that xquant build has them; only an xquant without them uses these two functions. They follow the
SPEC exactly (float32 arithmetic, division as written, round half to even, saturation, NaN -> 0, int4
packed eight per int32 with element 8k+j in bits 4j..4j+3) but are plain PyTorch, not the C++ library.
This module is deleted once the C++ operators have landed; nothing else imports it directly.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .. import _args

_INT8 = (-128, 127)
_INT4 = (-8, 7)


def _fail_type(op: str, msg: str) -> TypeError:
    return _args.fail_type(op, msg)


def _fail_value(op: str, msg: str) -> ValueError:
    return _args.fail_value(op, msg)


def _is_int4(op: str, name: str, d: Optional[torch.dtype], default_int4: bool = False) -> bool:
    """None / int8 / qint8 -> False; quint4x2 -> True."""
    if d is None:
        return default_int4
    if d in (torch.int8, getattr(torch, "qint8", torch.int8)):
        return False
    if d == getattr(torch, "quint4x2", None):
        return True
    raise _fail_value(op, f"{name} is {d} but expected None, torch.int8 / torch.qint8 or torch.quint4x2")


def _sat(v: Tensor, lo: int, hi: int) -> Tensor:
    """float32 values -> rint (half to even), NaN -> 0, saturated to [lo, hi] (+-Inf included), int32."""
    v = torch.round(v)
    v = torch.where(torch.isnan(v), torch.zeros_like(v), v)
    return v.clamp(lo, hi).to(torch.int32)


def _pack_int4(q: Tensor) -> Tensor:
    """int32 values in [-8, 7], last dimension a multiple of 8 -> int32 words (element 8k+j in bits 4j..4j+3)."""
    shape = q.shape
    nib = (q.to(torch.int64) & 0xF).reshape(*shape[:-1], shape[-1] // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    words = (nib << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement into int32
    return words.to(torch.int32)


def _unpack_int4(w: Tensor) -> Tensor:
    """int32 words -> int32 values in [-8, 7], the last dimension 8x longer."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    nib = (w.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF
    nib = torch.where(nib >= 8, nib - 16, nib)
    return nib.reshape(*w.shape[:-1], w.shape[-1] * 8).to(torch.int32)


def _smoothed_rows(op: str, x: Tensor, smooth_scales: Optional[Tensor], group_index: Optional[Tensor]) -> Tensor:
    """x (rank >= 2) as float32 rows [S, H], multiplied by the smooth scales (per expert with group_index)."""
    if not isinstance(x, Tensor):
        raise _fail_type(op, f"x is {_args.describe(x)} but expected a torch.Tensor")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise _fail_type(op, f"x has dtype {x.dtype} but expected float32, float16 or bfloat16")
    if x.dim() < 2:
        raise _fail_value(op, f"x has shape {list(x.shape)} but expected a rank >= 2 (rows x hidden)")
    h = x.shape[-1]
    s = math.prod(x.shape[:-1])
    rows = x.detach().float().reshape(s, h)
    if smooth_scales is None:
        if group_index is not None:
            raise _fail_value(op, "group_index is given but smooth_scales is None (group_index selects smooth rows)")
        return rows
    if smooth_scales.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise _fail_type(op, f"smooth_scales has dtype {smooth_scales.dtype} but expected a floating dtype")
    sm = smooth_scales.detach().float()
    if group_index is None:
        if sm.dim() != 1 or sm.shape[0] != h:
            raise _fail_value(op, f"smooth_scales has shape {list(sm.shape)} but expected [{h}] (x's last dimension)")
        return rows * sm
    if group_index.dtype not in (torch.int32, torch.int64):
        raise _fail_type(op, f"group_index has dtype {group_index.dtype} but expected int32 or int64")
    if sm.dim() != 2 or sm.shape[1] != h:
        raise _fail_value(op, f"smooth_scales has shape {list(sm.shape)} but expected [E, {h}] with group_index")
    e = sm.shape[0]
    if group_index.dim() != 1 or group_index.shape[0] != e:
        raise _fail_value(op, f"group_index has shape {list(group_index.shape)} but expected [{e}] "
                              "(one cumulative row end per smooth_scales row)")
    gi = group_index.detach().to(torch.int64).cpu()
    if e == 0 or int(gi[-1]) != s or bool((gi < 0).any()) or bool((gi[1:] < gi[:-1]).any()):
        raise _fail_value(op, f"group_index is {gi.tolist()[:8]} but expected non-decreasing row ends "
                              f">= 0 whose last value is the row count {s}")
    expert = torch.searchsorted(gi, torch.arange(s, dtype=torch.int64), right=True)  # first e with gi[e] > r
    return rows * sm[expert]


def _fallback_dynamic_quant(x: Tensor, smooth_scales: Optional[Tensor] = None, group_index: Optional[Tensor] = None,
                            dst_type: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """SPEC section 6 (symmetric per-token): scale = rowMax(|x'|) / DST_MAX, y = sat(rint(x' / scale))."""
    op = "dynamic_quant"
    int4 = _is_int4(op, "dst_type", dst_type)
    rows = _smoothed_rows(op, x, smooth_scales, group_index)
    h = x.shape[-1]
    if int4 and h % 8 != 0:
        raise _fail_value(op, f"x has last dimension {h} but int4 output (torch.quint4x2) needs a multiple of 8")
    lo, hi = _INT4 if int4 else _INT8
    if rows.shape[0] == 0 or h == 0:
        amax = torch.zeros(rows.shape[0], dtype=torch.float32)
    else:
        amax = rows.abs().amax(dim=1)  # NaN propagates
    scale = amax / torch.tensor(float(hi), dtype=torch.float32)
    q = _sat(rows / scale.unsqueeze(1), lo, hi).reshape(x.shape)
    y = _pack_int4(q) if int4 else q.to(torch.int8)
    return y, scale.reshape(x.shape[:-1])


def _fallback_anti_quant(x: Tensor, scale: Tensor, offset: Optional[Tensor] = None,
                         dst_dtype: Optional[torch.dtype] = None, src_dtype: Optional[torch.dtype] = None) -> Tensor:
    """SPEC section 7: out = narrow((float(x) + offset) * scale) to dst_dtype (float16 by default)."""
    op = "anti_quant"
    if not isinstance(x, Tensor):
        raise _fail_type(op, f"x is {_args.describe(x)} but expected a torch.Tensor")
    if x.dtype == torch.int8:
        if src_dtype is not None and src_dtype not in (torch.int8, getattr(torch, "qint8", torch.int8)):
            raise _fail_value(op, f"src_dtype is {src_dtype} but x is int8 (expected None or torch.int8)")
        vals = x.detach().to(torch.float32)
    elif x.dtype == torch.int32:
        if src_dtype is not None and src_dtype != getattr(torch, "quint4x2", None):
            raise _fail_value(op, f"src_dtype is {src_dtype} but x is int32 words of packed int4 "
                                  "(expected None or torch.quint4x2)")
        if x.dim() == 0:
            raise _fail_value(op, "x is a 0-d int32 tensor but packed int4 needs a last dimension")
        vals = _unpack_int4(x.detach()).to(torch.float32)
    else:
        raise _fail_type(op, f"x has dtype {x.dtype} but expected int8, or int32 holding eight int4 each")
    if x.dim() == 0:
        raise _fail_value(op, "x is 0-d but expected rank >= 1")
    dst = torch.float16 if dst_dtype is None else dst_dtype
    if dst not in (torch.float16, torch.bfloat16, torch.float32):
        raise _fail_value(op, f"dst_dtype is {dst_dtype} but expected torch.float16, torch.bfloat16 or torch.float32")
    n_last = vals.shape[-1]
    if not isinstance(scale, Tensor):
        raise _fail_type(op, f"scale is {_args.describe(scale)} but expected a torch.Tensor")
    if scale.dtype not in (torch.float32, torch.bfloat16):
        raise _fail_type(op, f"scale has dtype {scale.dtype} but expected float32 or bfloat16")
    if scale.dim() != 1 or scale.shape[0] not in (1, n_last):
        raise _fail_value(op, f"scale has shape {list(scale.shape)} but expected [1] or [{n_last}] "
                              "(the logical last dimension of x)")
    if offset is not None:
        if not isinstance(offset, Tensor):
            raise _fail_type(op, f"offset is {_args.describe(offset)} but expected a torch.Tensor or None")
        if offset.dtype != scale.dtype or offset.shape != scale.shape:
            raise _fail_value(op, f"offset has dtype {offset.dtype} and shape {list(offset.shape)} but expected "
                                  f"scale's ({scale.dtype}, {list(scale.shape)})")
        vals = vals + offset.detach().float()
    return (vals * scale.detach().float()).to(dst)
