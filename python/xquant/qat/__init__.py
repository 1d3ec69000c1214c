"""xquant.qat: quantization-aware training on xquant's operators (docs/qat.md).

    import xquant.qat as xqat
    model = xqat.prepare(model, "W4A16")               # or a config dict; targets= / ignore= as compressed-tensors
    xqat.calibrate(model, lambda m: [m(x) for x in calib_batches])
    ... train as usual (loss + xqat.quant_loss(model) with ActsULQ activations), DDP / FSDP2 work ...
    xqat.export(model, "out-dir")                      # compressed-tensors checkpoint; transformers / vLLM load it
"""

from ._calib import CALIBRATORS, HistogramCalibrator, MaxCalibrator, entropy_amax, mse_amax, percentile_amax
from ._config import PRESETS, IdentityQuantizer, normalize_config, preset
from ._export import export, export_state_dict
from ._modules import QUANT_CLASSES, QuantConv1d, QuantConv2d, QuantConv3d, QuantLinear, QuantModuleMixin
from ._prepare import calibrate, prepare, quant_loss, quant_modules, quantizers, set_quantizer_mode, summary
from ._quantizer import (MODES, ActsULQQuantizer, DynamicQuantizer, QuantizerBase, TensorQuantizer, WeightQuantizer,
                         weight_scales)
from . import targets

__all__ = ["prepare", "calibrate", "export", "export_state_dict", "quant_loss", "quantizers", "quant_modules",
           "set_quantizer_mode", "summary", "preset", "normalize_config", "PRESETS", "CALIBRATORS", "MODES",
           "TensorQuantizer", "WeightQuantizer", "DynamicQuantizer", "ActsULQQuantizer", "IdentityQuantizer",
           "QuantizerBase", "QuantLinear", "QuantConv1d", "QuantConv2d", "QuantConv3d", "QuantModuleMixin",
           "QUANT_CLASSES", "MaxCalibrator", "HistogramCalibrator", "percentile_amax", "mse_amax", "entropy_amax",
           "weight_scales", "targets"]
