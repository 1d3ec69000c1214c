"""Quant modules: Linear and Conv1d / Conv2d / Conv3d with an input quantizer and a weight quantizer.

``xquant.qat.prepare`` turns existing ``nn.Linear`` / ``nn.ConvNd`` modules into these in place (their
class is swapped, so parameters, hooks and references to the module are kept); they can also be built
directly like their torch counterparts, with ``quant_config=``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ._quantizer import QuantizerBase

__all__ = ["QuantModuleMixin", "QuantLinear", "QuantConv1d", "QuantConv2d", "QuantConv3d", "QUANT_CLASSES"]


class QuantModuleMixin:
    input_quantizer: QuantizerBase
    weight_quantizer: QuantizerBase

    def _setup_quantizers(self, quant_config) -> None:
        from ._config import make_input_quantizer, make_weight_quantizer, normalize_config

        cfg = normalize_config(quant_config)
        self.quant_config = cfg
        self.input_quantizer = make_input_quantizer(cfg["input_activations"])
        self.weight_quantizer = make_weight_quantizer(cfg["weights"])
        if not self.weight.is_meta:  # amax from the initial weight, as prepare does
            self.weight_quantizer.calibrate_from(self.weight)

    def quantized_weight(self) -> torch.Tensor:
        """The weight as the forward uses it (fake-quantized, or as is when the weight quantizer is off)."""
        return self.weight_quantizer(self.weight)


class QuantLinear(QuantModuleMixin, nn.Linear):
    """``nn.Linear`` computing ``linear(input_quantizer(x), weight_quantizer(weight), bias)``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 quant_config="W8A8") -> None:
        nn.Linear.__init__(self, in_features, out_features, bias, device, dtype)
        self._setup_quantizers(quant_config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.input_quantizer(x), self.weight_quantizer(self.weight), self.bias)


# convolutions: int8 weights per output channel, static int8 activations (calibrate before use)
CONV_DEFAULT = {"weights": {"num_bits": 8, "strategy": "channel"}, "input_activations": {"num_bits": 8}}


def _conv_class(base):
    class QuantConv(QuantModuleMixin, base):
        def __init__(self, *args, quant_config=CONV_DEFAULT, **kw) -> None:
            base.__init__(self, *args, **kw)
            self._setup_quantizers(quant_config)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._conv_forward(self.input_quantizer(x), self.weight_quantizer(self.weight), self.bias)

    QuantConv.__name__ = QuantConv.__qualname__ = "Quant" + base.__name__
    QuantConv.__doc__ = f"``nn.{base.__name__}`` computing the convolution of ``input_quantizer(x)`` with " \
                        "``weight_quantizer(weight)`` (by default int8 per output channel, and static int8 " \
                        "activations to calibrate)."
    return QuantConv


QuantConv1d = _conv_class(nn.Conv1d)
QuantConv2d = _conv_class(nn.Conv2d)
QuantConv3d = _conv_class(nn.Conv3d)

# float class -> quant class (exact classes: a subclass of nn.Linear may compute something else)
QUANT_CLASSES = {nn.Linear: QuantLinear, nn.Conv1d: QuantConv1d, nn.Conv2d: QuantConv2d, nn.Conv3d: QuantConv3d}


def convert_module(module: nn.Module, cfg: dict, name: str) -> nn.Module:
    """Swap ``module``'s class for its quant class in place and attach the quantizers (weights calibrated
    from the weight at once)."""
    from ._config import make_input_quantizer, make_weight_quantizer

    qcls = QUANT_CLASSES[type(module)]
    wq = make_weight_quantizer(cfg["weights"])
    iq = make_input_quantizer(cfg["input_activations"])
    module.__class__ = qcls
    module.quant_config = cfg
    module.input_quantizer = iq
    module.weight_quantizer = wq
    iq.qname, wq.qname = f"{name}.input_quantizer", f"{name}.weight_quantizer"
    if hasattr(wq, "calibrate_from"):
        wq.calibrate_from(module.weight)
    return module
