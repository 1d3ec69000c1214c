"""The quantizer modules: TensorQuantizer (xquant's fake tensor quantization), WeightQuantizer (the
compressed-tensors rule, bit-exact with the exported checkpoint), DynamicQuantizer (per-token int8, as
serving engines quantize W8A8 activations) and ActsULQQuantizer (learnable clip range)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

import xquant

from ..npu import acts_ulq, npu_dynamic_quant, npu_fake_tensor_quant, npu_fake_tensor_quant_with_axis, npu_quantize
from ._calib import CALIBRATORS, MaxCalibrator, _dist_world, make_calibrator

__all__ = ["QuantizerBase", "TensorQuantizer", "WeightQuantizer", "DynamicQuantizer", "ActsULQQuantizer",
           "MODES", "weight_scales"]

xquant.register_torch_ops()  # torch.ops.xquant.* (the weight quantizer's backward calls one)

MODES = ("quantize", "calibrate", "disabled")
_FLT_MIN = torch.finfo(torch.float32).tiny


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _check_int(who: str, name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"xquant.qat: quantizer {who}: {name} is {v!r} but expected an int in [{lo}, {hi}]")
    return v


def _check_bool(who: str, name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"xquant.qat: quantizer {who}: {name} is {v!r} but expected a bool")
    return v


class QuantizerBase(nn.Module):
    """State shared by every quantizer: ``mode`` is 'quantize' (the default), 'calibrate' (collect
    statistics, pass the input through unchanged) or 'disabled' (pass through)."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = "quantize"
        self.qname = f"({type(self).__name__})"  # the dotted name once prepare / calibrate set it (messages)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, m: str) -> None:
        if m not in MODES:
            raise ValueError(f"xquant.qat: quantizer {self.qname}: mode is {m!r} but expected one of {MODES}")
        self._mode = m

    def enable_quant(self) -> None:
        self.mode = "quantize"

    def enable_calib(self) -> None:
        self.mode = "calibrate"

    def disable(self) -> None:
        self.mode = "disabled"

    # calibration protocol (xquant.qat.calibrate)
    def reset_calibration(self) -> None:
        pass

    def load_calib_amax(self) -> bool:
        """Compute and store the range from the collected statistics; False when nothing was collected."""
        return True

    def is_calibrated(self) -> bool:
        return True


def _set_range(mod: nn.Module, name: str, value: torch.Tensor, learn: bool) -> None:
    value = value.detach().to(torch.float32).clone()
    if learn:
        cur = getattr(mod, name)
        if isinstance(cur, nn.Parameter) and cur.shape == value.shape:
            with torch.no_grad():
                cur.copy_(value)  # keep the Parameter object (optimizers, DDP hold it)
        else:
            setattr(mod, name, nn.Parameter(value))
    else:
        cur = getattr(mod, name)
        if isinstance(cur, torch.Tensor) and cur.shape == value.shape:
            with torch.no_grad():
                cur.copy_(value)
        else:
            setattr(mod, name, value)


class TensorQuantizer(QuantizerBase):
    _half_amax = True  # float16 inputs: amax rounded to float16 for the fake-quant operator
    """Fake quantization with xquant's operators (``npu_fake_tensor_quant`` per tensor,
    ``npu_fake_tensor_quant_with_axis`` per channel along ``axis``), the Ascend numbers::

        scale = (2^(num_bits - 1 + unsigned) - 1) / amax;  out = clamp(rint(x * scale), min_bound, max_bound) / scale

    ``amax`` is a float32 buffer, or a Parameter when ``learn_amax`` (trained by the operator's backward:
    ``grad_amax = sum(grad_out * (x > amax ? 1 : x < -amax ? min_bound / max_bound : 0))``, negative values
    clamped to 0 in the forward). It is None until calibrated (``xquant.qat.calibrate``) or set
    (``set_amax``); quantizing without it raises RuntimeError.
    ``calibrator``: 'max' (per tensor or per channel), 'percentile', 'mse' or 'entropy' (per tensor;
    ``calib_options`` such as ``{"percentile": 99.9, "num_bins": 2048, "start_bin": 128}``).
    """

    def __init__(self, num_bits: int = 8, axis: Optional[int] = None, unsigned: bool = False,
                 narrow_range: bool = True, calibrator: str = "max", learn_amax: bool = False,
                 calib_options: Optional[dict] = None, amax: Any = None) -> None:
        super().__init__()
        self.num_bits = _check_int(self.qname, "num_bits", num_bits, 1, 32)
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)):
            raise TypeError(f"xquant.qat: quantizer {self.qname}: axis is {axis!r} but expected None (per tensor) or an int")
        self.axis = axis
        self.unsigned = _check_bool(self.qname, "unsigned", unsigned)
        self.narrow_range = _check_bool(self.qname, "narrow_range", narrow_range)
        self.learn_amax = _check_bool(self.qname, "learn_amax", learn_amax)
        if calibrator not in CALIBRATORS:
            raise ValueError(f"xquant.qat: quantizer {self.qname}: calibrator is {calibrator!r} but expected one of "
                             f"{CALIBRATORS}")
        self.calibrator = calibrator
        self.calib_options = dict(calib_options or {})
        make_calibrator(calibrator, axis, num_bits, unsigned, narrow_range, self.qname, **self.calib_options)  # validate
        self._calib = None
        if learn_amax:
            self.register_parameter("amax", None)
        else:
            self.register_buffer("amax", None)
        if amax is not None:
            self.set_amax(amax)

    # ---- range ----
    def set_amax(self, amax: Any) -> None:
        a = torch.as_tensor(amax, dtype=torch.float32).detach().reshape(-1)
        if self.axis is None and a.numel() != 1:
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax has {a.numel()} elements but a per-tensor "
                             "quantizer expects 1")
        bad = ~torch.isfinite(a) | (a < 0)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax[{i}] is {float(a[i])} but expected a finite "
                             "value >= 0")
        _set_range(self, "amax", a, self.learn_amax)

    def is_calibrated(self) -> bool:
        return self.amax is not None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "amax"
        if key in state_dict and self.amax is None:  # an uncalibrated quantizer takes the saved amax' shape
            _set_range(self, "amax", torch.zeros(state_dict[key].shape), self.learn_amax)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ---- calibration ----
    def _new_calibrator(self):
        return make_calibrator(self.calibrator, self.axis, self.num_bits, self.unsigned, self.narrow_range,
                               self.qname, **self.calib_options)

    def reset_calibration(self) -> None:
        self._calib = self._new_calibrator()

    def collect(self, x: torch.Tensor) -> None:
        if self._calib is None:
            self.reset_calibration()
        self._calib.collect(x)

    def load_calib_amax(self) -> bool:
        if self._calib is None:
            return False
        a = self._calib.compute_amax(sync=True)
        if a is None:
            return False
        self.set_amax(a)
        self._calib = None
        return True

    # ---- forward ----
    def _amax_for(self, x: torch.Tensor) -> torch.Tensor:
        a = self.amax
        if a is None:
            raise RuntimeError(f"xquant.qat: quantizer {self.qname} has no amax: calibrate the model first "
                               "(xquant.qat.calibrate(model, forward_loop)) or call set_amax")
        if hasattr(a, "full_tensor") and not hasattr(x, "full_tensor"):  # FSDP2-sharded, read outside forward
            a = a.full_tensor()
        if self.learn_amax:
            a = a.clamp_min(0)
        if a.device != x.device:
            a = a.to(x.device)
        if x.dtype == torch.float16 and self._half_amax:  # the float16 operator needs a float16-representable amax
            a = a.to(torch.float16)
        return a

    def _quantize(self, x: torch.Tensor) -> torch.Tensor:
        a = self._amax_for(x)
        if self.axis is None:
            return npu_fake_tensor_quant(x, a, self.num_bits, self.unsigned, self.narrow_range)
        return npu_fake_tensor_quant_with_axis(x, a, self.axis, self.num_bits, self.unsigned, self.narrow_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._mode == "disabled":
            return x
        if self._mode == "calibrate":
            self.collect(x)
            return x
        return self._quantize(x)

    def extra_repr(self) -> str:
        s = f"num_bits={self.num_bits}, axis={self.axis}, "
        if type(self) is TensorQuantizer:
            s += f"unsigned={self.unsigned}, narrow_range={self.narrow_range}, "
        s += f"calibrator={self.calibrator}, learn_amax={self.learn_amax}, mode={self._mode}, amax="
        a = self.amax
        if a is None:
            s += "None"
        elif a.numel() == 1:
            s += f"{float(a.detach().reshape(())):.6g}"
        else:
            d = a.detach().float()
            s += f"[{float(d.min()):.6g}, {float(d.max()):.6g}] x {tuple(a.shape)}"
        return s


# ---------------------------------------------------------------------------------------------------------
# Weights: the compressed-tensors rule (docs/cli.md, "The numbers"), so that the model trains with exactly
# the weights the exported checkpoint decompresses to.

def weight_scales(amax: torch.Tensor, num_bits: int, scale_dtype: torch.dtype) -> torch.Tensor:
    """The stored scale s' (float32 values of scale_dtype) for float32 ``amax``, the CLI writer's rule:
    s = amax / qmax; all-zero group -> 1; below FLT_MIN -> FLT_MIN; rounded to scale_dtype (float16: a
    scale that rounds to 0 becomes 2^-24)."""
    qmax = float((1 << (num_bits - 1)) - 1)
    a = amax.float()
    s = a / qmax
    s = torch.where(a == 0, torch.ones_like(s), s)
    s = torch.where(s < _FLT_MIN, torch.full_like(s, _FLT_MIN), s)
    sq = s.to(scale_dtype)
    if scale_dtype == torch.float16:
        sq = torch.where(sq == 0, torch.full_like(sq, 2.0 ** -24), sq)
    return sq.float()


def _weight_q(wv: torch.Tensor, s: torch.Tensor, num_bits: int) -> torch.Tensor:
    """The integers of the [rows, G] view: int8 ``sat(rint(x / s'))``; int4 ``sat4(rint(x * (1 / s')))``
    (npu_quantize, as the CLI's writer calls it)."""
    if num_bits == 8:
        return npu_quantize(wv, s, None, torch.qint8, 0, True)
    q = npu_quantize(wv, 1.0 / s, None, torch.qint8, -2, False)
    return q.clamp(-8, 7)


class _WeightFakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wv: torch.Tensor, amax: torch.Tensor, num_bits: int, scale_dtype: torch.dtype):
        a = amax.reshape(-1).float()
        s = weight_scales(a, num_bits, scale_dtype)
        q = _weight_q(wv, s, num_bits)
        ctx.save_for_backward(wv, a)
        ctx.num_bits = num_bits
        return (q.float() * s.unsqueeze(1)).to(wv.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        wv, a = ctx.saved_tensors
        need_a = ctx.needs_input_grad[1]
        # the documented operator (docs/python.md "PyTorch integration"): traceable inside a compiled backward
        gw, ga = torch.ops.xquant.fake_tensor_quant_backward(g.float().contiguous(), wv.float().contiguous(), a, 0,
                                                             ctx.num_bits, False, True, need_a)
        return gw.to(wv.dtype), (ga if need_a else None), None, None


class WeightQuantizer(TensorQuantizer):
    """The weight quantizer of a Quant module: symmetric int4 / int8, one amax per output channel
    (``strategy='channel'``), per group of ``group_size`` input channels (``'group'``) or per tensor
    (``'tensor'``). Forward (bit for bit what the exported compressed-tensors checkpoint decompresses to):
    ``s' = round_to_S(amax / qmax)`` (S: the weight's dtype), ``q = npu_quantize(w, s')`` (int8:
    ``sat(rint(w / s'))``, int4: ``sat(rint(w * (1 / s')))``), ``out = q * s'`` narrowed once to the weight's
    dtype. Backward: the fake-quant operator's straight-through gradient with the window ``[-amax, amax]``,
    and its grad_amax when ``learn_amax``. Calibrator: 'max' over the finite weight values (the CLI's rule)."""

    _half_amax = False  # the scale rule takes the float32 amax whatever the weight's dtype (as the CLI)

    def __init__(self, num_bits: int = 4, strategy: str = "group", group_size: Optional[int] = 128,
                 learn_amax: bool = False) -> None:
        if num_bits not in (4, 8):
            raise ValueError(f"xquant.qat: weight quantizer: num_bits is {num_bits!r} but expected 4 or 8 (the "
                             "compressed-tensors integer weights xquant writes)")
        if strategy not in ("channel", "group", "tensor"):
            raise ValueError(f"xquant.qat: weight quantizer: strategy is {strategy!r} but expected 'channel', "
                             "'group' or 'tensor'")
        if strategy == "group" and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0
                                    or group_size % 8):
            raise ValueError(f"xquant.qat: weight quantizer: group_size is {group_size!r} but expected a positive "
                             "multiple of 8 for strategy 'group'")
        super().__init__(num_bits=num_bits, axis=None if strategy == "tensor" else 0, unsigned=False,
                         narrow_range=True, calibrator="max", learn_amax=learn_amax)
        self.strategy = strategy
        self.group_size = group_size if strategy == "group" else None

    def group_of(self, w: torch.Tensor) -> int:
        """G: elements per scale of the [rows, G] view of the weight."""
        k = w[0].numel() if w.ndim else 1
        if self.strategy == "tensor":
            return w.numel()
        if self.strategy == "channel":
            return k
        if w.ndim != 2 or k % self.group_size:
            raise ValueError(f"xquant.qat: quantizer {self.qname}: strategy 'group' needs a 2-D weight whose input "
                             f"dimension is a multiple of group_size={self.group_size}; the weight has shape "
                             f"{list(w.shape)}")
        return self.group_size

    def amax_shape(self, w: torch.Tensor) -> tuple:
        if self.strategy == "tensor":
            return (1,)
        if self.strategy == "channel":
            return (w.shape[0],)
        return (w.shape[0], w.shape[1] // self.group_of(w))

    def set_amax(self, amax: Any) -> None:
        a = torch.as_tensor(amax, dtype=torch.float32).detach()
        bad = ~torch.isfinite(a) | (a < 0)
        if bool(bad.any()):
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax has {int(bad.sum())} value(s) that are NaN, "
                             "Inf or negative (expected finite values >= 0)")
        if self.amax is not None and tuple(self.amax.shape) != tuple(a.shape):
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax has shape {list(a.shape)} but the quantizer's "
                             f"amax has shape {list(self.amax.shape)} (one per {self.strategy})")
        _set_range(self, "amax", a, self.learn_amax)

    def _new_calibrator(self):
        return MaxCalibrator(axis=0, skip_nonfinite=True, who=self.qname)

    @torch.no_grad()
    def calibrate_from(self, w: torch.Tensor) -> None:
        """amax = max |w| over the finite values of every channel / group (the CLI's rule)."""
        if hasattr(w, "full_tensor"):  # a DTensor (FSDP2): the whole weight
            w = w.full_tensor()
        w = w.detach()
        g = self.group_of(w)
        c = MaxCalibrator(axis=0, skip_nonfinite=True, who=self.qname)
        c.collect(w.reshape(-1, g))
        self.set_amax(c.amax.reshape(self.amax_shape(w)))

    def scales(self, w: torch.Tensor) -> torch.Tensor:
        """The stored scales s' of weight ``w`` (float32 values of w's dtype), shaped [N, K / G] (channel: [N, 1];
        tensor: [1, 1])."""
        a = self._amax_for(w).float()
        s = weight_scales(a.reshape(-1), self.num_bits, w.dtype)
        if self.strategy == "tensor":
            return s.reshape(1, 1)
        return s.reshape(w.shape[0], -1)

    def check_scales(self, w: torch.Tensor) -> None:
        """ValueError when a stored scale would not be finite (amax / qmax overflows the weight's dtype)."""
        s = weight_scales(self._amax_for(w).float().reshape(-1), self.num_bits, w.dtype)
        if not bool(torch.isfinite(s).all()):
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax up to {float(self.amax.max())} gives a scale "
                             f"that overflows {w.dtype} (expected a finite scale; lower amax)")

    def integers(self, w: torch.Tensor) -> torch.Tensor:
        """The stored integers q (int8 tensor of w's shape as [N, K]-like rows)."""
        g = self.group_of(w)
        a = self._amax_for(w).float().reshape(-1)
        s = weight_scales(a, self.num_bits, w.dtype)
        return _weight_q(w.detach().reshape(-1, g).contiguous(), s, self.num_bits).reshape(w.shape)

    def _quantize(self, w: torch.Tensor) -> torch.Tensor:
        a = self._amax_for(w)
        if not _compiling():
            self.check_scales(w)
        g = self.group_of(w)
        wv = w.reshape(-1, g)
        if not wv.is_contiguous():
            wv = wv.contiguous()
        if a.numel() != wv.shape[0]:
            raise ValueError(f"xquant.qat: quantizer {self.qname}: amax has {a.numel()} elements but the weight of "
                             f"shape {list(w.shape)} has {wv.shape[0]} {self.strategy}s")
        return _WeightFakeQuant.apply(wv, a, self.num_bits, w.dtype).reshape(w.shape)

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        if self._mode == "disabled":
            return w
        if self._mode == "calibrate":
            self.calibrate_from(w)
            return w
        return self._quantize(w)

    def extra_repr(self) -> str:
        s = f"strategy={self.strategy}" + (f", group_size={self.group_size}" if self.group_size else "") + ", "
        return s + super().extra_repr()


# ---------------------------------------------------------------------------------------------------------

class _TokenFakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2: torch.Tensor):
        y, scale = npu_dynamic_quant(x2)
        return (y.float() * scale.float().unsqueeze(-1)).to(x2.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g  # the row's range always contains the row: straight through


class DynamicQuantizer(QuantizerBase):
    """Dynamic symmetric per-token int8 (W8A8's activations): ``y, scale = npu_dynamic_quant(x)`` (scale =
    row max |x| / 127, ``y = sat(rint(x / scale))``, computed by the operator on every call), out =
    ``y * scale`` narrowed to x's dtype; gradient straight through. Nothing to calibrate."""

    def __init__(self, num_bits: int = 8) -> None:
        super().__init__()
        if num_bits != 8:
            raise ValueError(f"xquant.qat: dynamic quantizer: num_bits is {num_bits!r} but expected 8")
        self.num_bits = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._mode != "quantize" or x.numel() == 0:
            return x
        x2 = x.reshape(-1, x.shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        return _TokenFakeQuant.apply(x2).reshape(x.shape)

    def extra_repr(self) -> str:
        return f"num_bits=8, dynamic=token, mode={self._mode}"


class ActsULQQuantizer(QuantizerBase):
    """ActsULQ activation quantizer (``xquant.npu.acts_ulq``): learnable ``clamp_min`` / ``clamp_max``
    Parameters of shape [1] (initialized by calibration to the data's min / max, or given), ``fixed_min``
    (clip at 0 from below), ``num_bits`` in [2, 16]. Each quantizing forward keeps its quantization loss
    ``mean((y - x)^2)`` (differentiable; :func:`xquant.qat.quant_loss` sums them) and the operator's mean
    ``x_clamped_loss`` (``clamped_loss``, detached, for monitoring)."""

    def __init__(self, num_bits: int = 8, fixed_min: bool = False, clamp_min: Optional[float] = None,
                 clamp_max: Optional[float] = None, collect_loss: bool = True) -> None:
        super().__init__()
        self.num_bits = _check_int(self.qname, "num_bits", num_bits, 2, 16)
        self.fixed_min = _check_bool(self.qname, "fixed_min", fixed_min)
        self.collect_loss = _check_bool(self.qname, "collect_loss", collect_loss)
        self.register_parameter("clamp_min", None)
        self.register_parameter("clamp_max", None)
        self._range = None
        self.last_loss: Optional[torch.Tensor] = None
        self.clamped_loss: Optional[torch.Tensor] = None
        if (clamp_min is None) != (clamp_max is None):
            raise ValueError("xquant.qat: ActsULQ quantizer: give both clamp_min and clamp_max, or neither (calibrate)")
        if clamp_min is not None:
            self.set_range(clamp_min, clamp_max)

    def set_range(self, clamp_min: Any, clamp_max: Any) -> None:
        lo = torch.as_tensor(clamp_min, dtype=torch.float32).reshape(-1)
        hi = torch.as_tensor(clamp_max, dtype=torch.float32).reshape(-1)
        if lo.numel() != 1 or hi.numel() != 1 or not bool(torch.isfinite(lo).all() and torch.isfinite(hi).all()):
            raise ValueError(f"xquant.qat: quantizer {self.qname}: clamp_min / clamp_max are {lo.tolist()} / "
                             f"{hi.tolist()} but expected one finite value each")
        _set_range(self, "clamp_min", lo, True)
        _set_range(self, "clamp_max", hi, True)

    def is_calibrated(self) -> bool:
        return self.clamp_min is not None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kw):
        for n in ("clamp_min", "clamp_max"):
            if prefix + n in state_dict and getattr(self, n) is None:
                _set_range(self, n, torch.zeros(state_dict[prefix + n].shape), True)
        super()._load_from_state_dict(state_dict, prefix, *args, **kw)

    def reset_calibration(self) -> None:
        self._range = None

    @torch.no_grad()
    def collect(self, x: torch.Tensor) -> None:
        from ._calib import _check_finite

        xf = x.detach().float()
        _check_finite(xf, self.qname, "actsulq min/max")
        if xf.numel() == 0:
            return
        r = torch.stack([-xf.min(), xf.max()])
        self._range = r if self._range is None else torch.maximum(self._range, r)

    def load_calib_amax(self) -> bool:
        if self._range is None:
            return False
        r = self._range.clone()
        if _dist_world() > 1:
            torch.distributed.all_reduce(r, op=torch.distributed.ReduceOp.MAX)
        self.set_range((-r[0]).cpu(), r[1].cpu())
        self._range = None
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._mode == "disabled":
            return x
        if self._mode == "calibrate":
            self.collect(x)
            return x
        if self.clamp_min is None:
            raise RuntimeError(f"xquant.qat: quantizer {self.qname} has no clamp range: calibrate the model first "
                               "(xquant.qat.calibrate(model, forward_loop)) or call set_range")
        lo, hi = self.clamp_min, self.clamp_max
        if lo.dtype != x.dtype:  # the operator takes the clamps in x's dtype (the cast passes gradients on)
            lo, hi = lo.to(x.dtype), hi.to(x.dtype)
        y, _mn, _mx, loss = acts_ulq(x, lo, hi, self.fixed_min, self.num_bits)
        if self.collect_loss:
            self.last_loss = (y.float() - x.float()).square().mean()
            self.clamped_loss = loss.detach().float().mean()
        return y

    def extra_repr(self) -> str:
        r = "None" if self.clamp_min is None else \
            f"[{float(self.clamp_min.detach().reshape(())):.6g}, {float(self.clamp_max.detach().reshape(())):.6g}]"
        return f"num_bits={self.num_bits}, fixed_min={self.fixed_min}, mode={self._mode}, range={r}"
