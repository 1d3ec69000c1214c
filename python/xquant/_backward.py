"""The backward operators as plain functions (NumPy or torch), for users who drive gradients themselves
(autograd calls the same C++ kernels through torch.ops.xquant.*_backward)."""

from __future__ import annotations

from typing import Any, Optional

from . import _args
from .npu import _backend


def fake_tensor_quant_backward(grad_out, inputs, amax, axis: Optional[int] = None, num_bits: int = 8,
                               is_unsigned: bool = False, narrow_range: bool = True,
                               want_grad_amax: bool = True):
    """Gradients of npu_fake_tensor_quant (axis=None) / npu_fake_tensor_quant_with_axis; returns
    ``(grad_inputs, grad_amax)`` (grad_amax None unless want_grad_amax)::

        grad_inputs = grad_out where min_bound/scale <= inputs <= max_bound/scale, else 0
        grad_amax   = sum(grad_out * (x > max_bound/scale ? 1 : x < min_bound/scale ? min_bound/max_bound : 0))

    grad_amax has amax's shape and dtype (per channel for the per-axis form), summed in xquant's fixed
    blocked order (bit-identical for every thread count).
    """
    op = "fake_tensor_quant_backward"
    b = _backend(op, "inputs", inputs)
    return b.fake_tensor_quant_backward(op, grad_out, inputs, amax, _args.as_opt_int(op, "axis", axis),
                                        _args.as_int(op, "num_bits", num_bits),
                                        _args.as_bool(op, "is_unsigned", is_unsigned),
                                        _args.as_bool(op, "narrow_range", narrow_range),
                                        _args.as_bool(op, "want_grad_amax", want_grad_amax))


def acts_ulq_backward(y_grad, x_shape: Any, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask, x_clamped_loss,
                      fixed_min: bool = False, num_bits: int = 8):
    """Gradients of acts_ulq; returns ``(x_grad, clamp_min_grad, clamp_max_grad)``::

        x_grad         = y_grad * clamp_min_mask * clamp_max_mask
        clamp_min_grad = sum(y_grad * ((1 - clamp_min_mask) - x_clamped_loss)), 0 where fixed_min or clamp_min > 0
        clamp_max_grad = sum(y_grad * (x_clamped_loss + (1 - clamp_max_mask))), 0 where clamp_max < LEVELS * EPS

    each summed (fixed blocked order) down to the shape of its input: x_shape, clamp_min's, clamp_max's.
    """
    op = "acts_ulq_backward"
    b = _backend(op, "y_grad", y_grad)
    try:
        shape = tuple(_args.as_int(op, "x_shape", d) for d in x_shape)
    except TypeError:
        raise _args.fail_type(op, f"x_shape is {_args.describe(x_shape)} but expected a sequence of ints") from None
    return b.acts_ulq_backward(op, y_grad, shape, clamp_min, clamp_max, clamp_min_mask, clamp_max_mask,
                               x_clamped_loss, _args.as_bool(op, "fixed_min", fixed_min),
                               _args.as_int(op, "num_bits", num_bits))
