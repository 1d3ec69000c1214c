"""prepare / calibrate / quant_loss and the quantizer-state helpers."""

from __future__ import annotations

import warnings
from typing import Callable, Iterable, Iterator, Optional, Union

import torch
from torch import nn

from ._config import normalize_config
from ._modules import QUANT_CLASSES, QuantModuleMixin, convert_module
from ._quantizer import ActsULQQuantizer, QuantizerBase, WeightQuantizer
from .targets import DEFAULT_DENSE, check_patterns, is_match, match_modules

__all__ = ["prepare", "calibrate", "quant_loss", "quantizers", "set_quantizer_mode", "summary", "quant_modules"]


def _last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _tied_lm_head(model: nn.Module, name: str) -> bool:
    cfg = getattr(model, "config", None)
    return _last(name) == "lm_head" and bool(getattr(cfg, "tie_word_embeddings", False))


def _fit_problem(module: nn.Module, cfg: dict) -> Optional[str]:
    """Why the module's weight cannot take this config (None when it can)."""
    w, a = cfg["weights"], cfg["input_activations"]
    k = module.weight[0].numel() if module.weight.ndim else 0
    if module.weight.numel() == 0:
        return "the weight is empty"
    if module.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"the weight's dtype {module.weight.dtype} is not float32, float16 or bfloat16"
    if w["strategy"] == "group":
        if not isinstance(module, nn.Linear):
            return "strategy 'group' applies to Linear weights only (use 'channel' for convolutions)"
        if k % w["group_size"]:
            return f"input dimension {k} is not divisible by the group size {w['group_size']}"
    if a is not None and a.get("dynamic") == "token" and not isinstance(module, nn.Linear):
        return "dynamic per-token activations apply to Linear inputs (use static activations for convolutions)"
    packed = not (w["num_bits"] == 8 and a is not None)
    per = 32 // w["num_bits"]
    if isinstance(module, nn.Linear) and packed and k % per:
        return f"input dimension {k} is not divisible by {per} (values per packed int32 of the checkpoint)"
    return None


def prepare(model: nn.Module, config: Union[str, dict] = "W4A16", targets: Optional[Iterable[str]] = None,
            ignore: Optional[Iterable[str]] = None, *, forward_loop: Optional[Callable] = None,
            strict: bool = False) -> nn.Module:
    """Turn the model's ``nn.Linear`` / ``nn.Conv1d`` / ``Conv2d`` / ``Conv3d`` modules into quant modules,
    in place, and return the model.

    ``config``: a preset name (``W4A16``, ``W8A16``, ``W8A8``, case-insensitive) or a config dict
    (docs/qat.md). ``targets`` / ``ignore``: compressed-tensors patterns (class names such as ``"Linear"``,
    ``"re:<regex>"`` matched at the start of the module name, exact module names); a pattern matching no
    module is a ValueError. Without ``targets``: every Linear and Conv module except output heads and MoE
    routers (last name ``lm_head``, ``embed_out``, ``gate``, ``router``, ``shared_expert_gate``, and
    ``cls.predictions.decoder``), the CLI's default. A tied ``lm_head`` always stays dense. A module whose
    weight the config cannot quantize (input dimension not divisible by the group size or by the values per
    packed word) stays dense with a warning, or raises with ``strict=True``. Weight quantizers are calibrated
    from the weights at once; with ``forward_loop`` the activations are calibrated too
    (:func:`calibrate`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"xquant.qat.prepare: model is {type(model).__name__} but expected a torch.nn.Module")
    cfg = normalize_config(config)
    ignore_l = check_patterns("ignore", ignore)
    if targets is None:
        if ignore_l:
            list(match_modules(model, ["re:.*"], ignore_l))  # every ignore pattern must match something
        cands = [(n, m) for n, m in model.named_modules() if n and type(m) in QUANT_CLASSES
                 and _last(n) not in DEFAULT_DENSE and n != "cls.predictions.decoder" and not is_match(n, m, ignore_l)]
    else:
        tl = check_patterns("targets", targets)
        matched = list(match_modules(model, tl, ignore_l))
        cands = [(n, m) for n, m in matched if type(m) in QUANT_CLASSES or isinstance(m, QuantModuleMixin)]
        if not cands and matched:
            raise ValueError(f"xquant.qat.prepare: targets {tl} match only modules that are not Linear / Conv1d / "
                             f"Conv2d / Conv3d (e.g. {matched[0][0]!r}, a {type(matched[0][1]).__name__})")
    done = 0
    for name, mod in cands:
        if isinstance(mod, QuantModuleMixin):
            raise ValueError(f"xquant.qat.prepare: module {name!r} is already a {type(mod).__name__} (prepare once)")
        if _tied_lm_head(model, name):
            if targets is not None:
                warnings.warn(f"xquant.qat.prepare: {name!r} is tied to the input embedding (tie_word_embeddings) "
                              "and stays dense", stacklevel=2)
            continue
        why = _fit_problem(mod, cfg)
        if why is not None:
            msg = f"xquant.qat.prepare: module {name!r} ({type(mod).__name__}, weight {list(mod.weight.shape)}) stays dense: {why}"
            if strict:
                raise ValueError(msg)
            warnings.warn(msg, stacklevel=2)
            continue
        convert_module(mod, cfg, name)
        done += 1
    if done == 0:
        raise ValueError(f"xquant.qat.prepare: no module of {type(model).__name__} was quantized (no Linear / Conv "
                         "module matched, or none fits the config)")
    if forward_loop is not None:
        calibrate(model, forward_loop)
    return model


def quant_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for n, m in model.named_modules():
        if isinstance(m, QuantModuleMixin):
            yield n, m


def quantizers(model: nn.Module) -> Iterator[tuple[str, QuantizerBase]]:
    """(name, quantizer) for every quantizer of the model."""
    for n, m in model.named_modules():
        if isinstance(m, QuantizerBase):
            yield n, m


def set_quantizer_mode(model: nn.Module, mode: str, pattern: Optional[str] = None) -> int:
    """Set 'quantize' / 'calibrate' / 'disabled' on the quantizers whose name matches ``pattern``
    (``re:<regex>`` at the start of the name, or an exact name; all when None). Returns how many."""
    import re

    n = 0
    for name, q in quantizers(model):
        if pattern is None or (re.match(pattern[3:], name) if pattern.startswith("re:") else pattern == name):
            q.mode = mode
            n += 1
    if pattern is not None and n == 0:
        raise ValueError(f"xquant.qat.set_quantizer_mode: pattern {pattern!r} matches no quantizer")
    return n


@torch.no_grad()
def calibrate(model: nn.Module, forward_loop: Optional[Callable[[nn.Module], None]] = None) -> nn.Module:
    """Calibrate every quantizer that is not disabled: weight quantizers from their weights, activation
    quantizers from what they see while ``forward_loop(model)`` runs (under ``torch.no_grad``, with the
    quantizers in 'calibrate' mode, i.e. passing data through unquantized), with the calibrator each was made
    with. With ``torch.distributed`` initialized the statistics are reduced across ranks (docs/qat.md), so
    every rank ends with the same amax. A quantizer that saw no data keeps its earlier range if it had one,
    and is a ValueError otherwise. Quantizers end in 'quantize' mode."""
    qs = [(n, q) for n, q in quantizers(model) if q.mode != "disabled"]
    for n, q in qs:
        q.qname = n
    mods = {id(m.weight_quantizer): m for _, m in quant_modules(model)}
    for n, q in qs:
        if isinstance(q, WeightQuantizer) and id(q) in mods:
            q.calibrate_from(mods[id(q)].weight)
    acts = [(n, q) for n, q in qs if not isinstance(q, WeightQuantizer) and hasattr(q, "collect")]
    if forward_loop is not None and acts:
        for _, q in acts:
            q.reset_calibration()
            q.mode = "calibrate"
        try:
            forward_loop(model)
        finally:
            for _, q in acts:
                q.mode = "quantize"
        missing = []
        for n, q in acts:
            if not q.load_calib_amax() and not q.is_calibrated():
                missing.append(n)
        if missing:
            raise ValueError(f"xquant.qat.calibrate: quantizer(s) {missing} saw no data in forward_loop and have no "
                             "range (is the module used by the forward pass?)")
    return model


def quant_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the ActsULQ quantizers' quantization losses (``mean((y - x)^2)`` of their last forward),
    differentiable, to add to the training loss. A zero tensor when there are none."""
    total = None
    for m in model.modules():
        if isinstance(m, ActsULQQuantizer) and m.last_loss is not None:
            total = m.last_loss if total is None else total + m.last_loss
    return total if total is not None else torch.zeros(())


def summary(model: nn.Module) -> str:
    """One line per quantizer: name, mode and settings (its repr)."""
    lines = [f"{n}: {q.__class__.__name__}({q.extra_repr()})" for n, q in quantizers(model)]
    lines.append(f"{sum(1 for _ in quant_modules(model))} quant modules, {len(lines)} quantizers")
    return "\n".join(lines)
