"""Quantization configs: the CLI's presets (W4A16, W8A16, W8A8, case-insensitive) and explicit dicts.

A config is a dict with two entries (compressed-tensors' vocabulary, plus xquant's training options)::

    {"weights": {"num_bits": 4 | 8, "strategy": "group" | "channel" | "tensor", "group_size": 128,
                 "learn_amax": False},
     "input_activations": None                                    # A16: not quantized
                          | {"num_bits": 8, "dynamic": "token"}  # per-token int8 at run time (W8A8)
                          | {"num_bits": 8, "dynamic": False, "strategy": "tensor", "calibrator": "max",
                             "learn_amax": False, "unsigned": False, "narrow_range": True,
                             "calib_options": {...}}             # static amax: xquant's fake quant
                          | {"type": "actsulq", "num_bits": 8, "fixed_min": False}}   # learnable clip range

Missing keys take the defaults shown; unknown keys are a ValueError naming them.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Union

from ._quantizer import ActsULQQuantizer, DynamicQuantizer, QuantizerBase, TensorQuantizer, WeightQuantizer

__all__ = ["PRESETS", "preset", "normalize_config", "make_weight_quantizer", "make_input_quantizer",
           "IdentityQuantizer"]

PRESETS = {
    "W4A16": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}, "input_activations": None},
    "W8A16": {"weights": {"num_bits": 8, "strategy": "group", "group_size": 128}, "input_activations": None},
    "W8A8": {"weights": {"num_bits": 8, "strategy": "channel"}, "input_activations": {"num_bits": 8, "dynamic": "token"}},
}

_W_KEYS = {"num_bits", "strategy", "group_size", "learn_amax", "type", "symmetric"}
_A_KEYS = {"num_bits", "dynamic", "strategy", "calibrator", "learn_amax", "unsigned", "narrow_range",
           "calib_options", "type", "fixed_min", "symmetric", "collect_loss"}


class IdentityQuantizer(QuantizerBase):
    """No quantization (an A16 preset's input quantizer)."""

    def forward(self, x):
        return x

    def extra_repr(self) -> str:
        return "identity"


def preset(name: str, group_size: Optional[int] = None) -> dict:
    """A copy of a preset's config (``name`` case-insensitive); ``group_size`` 0 means per output channel."""
    if not isinstance(name, str) or name.upper() not in PRESETS:
        raise ValueError(f"xquant.qat: preset is {name!r} but expected one of {sorted(PRESETS)} (case-insensitive) "
                         "or a config dict")
    cfg = copy.deepcopy(PRESETS[name.upper()])
    if group_size is not None:
        if name.upper() == "W8A8" and group_size != 0:
            raise ValueError(f"xquant.qat: group_size is {group_size} but W8A8 has one scale per output channel")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0 or group_size % 8:
            raise ValueError(f"xquant.qat: group_size is {group_size!r} but expected 0 (per output channel) or a "
                             "positive multiple of 8")
        if group_size == 0:
            cfg["weights"] = {"num_bits": cfg["weights"]["num_bits"], "strategy": "channel"}
        else:
            cfg["weights"]["group_size"] = group_size
    return cfg


def _check_keys(what: str, d: Any, allowed: set) -> dict:
    if not isinstance(d, dict):
        raise TypeError(f"xquant.qat: config {what} is {d!r} but expected a dict or None")
    extra = sorted(set(d) - allowed)
    if extra:
        raise ValueError(f"xquant.qat: config {what} has unknown keys {extra} (expected some of {sorted(allowed)})")
    return d


def normalize_config(cfg: Union[str, dict]) -> dict:
    """The full config dict (defaults filled in, validated) of a preset name or a config dict."""
    if isinstance(cfg, str):
        cfg = preset(cfg)
    if not isinstance(cfg, dict):
        raise TypeError(f"xquant.qat: config is {cfg!r} but expected a preset name (W4A16, W8A16, W8A8) or a dict")
    _check_keys("", cfg, {"weights", "input_activations"})
    if "weights" not in cfg or cfg["weights"] is None:
        raise ValueError("xquant.qat: config has no 'weights' entry (xquant.qat quantizes weights; see docs/qat.md)")
    w = dict(_check_keys("'weights'", cfg["weights"], _W_KEYS))
    if w.get("type", "int") != "int" or w.get("symmetric", True) is not True:
        raise ValueError("xquant.qat: config 'weights' must be symmetric integers (type 'int', symmetric True)")
    w.pop("type", None), w.pop("symmetric", None)
    w.setdefault("num_bits", 8)
    w.setdefault("strategy", "channel")
    w.setdefault("group_size", 128 if w["strategy"] == "group" else None)
    w.setdefault("learn_amax", False)
    make_weight_quantizer(w)  # validates
    a = cfg.get("input_activations")
    if a is not None:
        a = dict(_check_keys("'input_activations'", a, _A_KEYS))
        if a.get("symmetric", True) is not True and a.get("type") != "actsulq":
            raise ValueError("xquant.qat: config 'input_activations': symmetric False is only available as type 'actsulq'")
        a.pop("symmetric", None)
        a.setdefault("num_bits", 8)
        t = a.setdefault("type", "int")
        if t == "actsulq":
            a.setdefault("fixed_min", False)
            bad = sorted(set(a) - {"type", "num_bits", "fixed_min", "collect_loss"})
        elif t == "int":
            a.setdefault("dynamic", False)
            if a["dynamic"] == "token" or a["dynamic"] is True:
                a["dynamic"] = "token"
                bad = sorted(set(a) - {"type", "num_bits", "dynamic"})
            else:
                a.setdefault("strategy", "tensor")
                a.setdefault("calibrator", "max")
                a.setdefault("learn_amax", False)
                a.setdefault("unsigned", False)
                a.setdefault("narrow_range", True)
                a.setdefault("calib_options", {})
                bad = sorted(set(a) - {"type", "num_bits", "dynamic", "strategy", "calibrator", "learn_amax",
                                        "unsigned", "narrow_range", "calib_options"})
        else:
            raise ValueError(f"xquant.qat: config 'input_activations' type is {t!r} but expected 'int' or 'actsulq'")
        if bad:
            raise ValueError(f"xquant.qat: config 'input_activations' keys {bad} do not apply to this kind of quantizer")
        make_input_quantizer(a)  # validates
    return {"weights": w, "input_activations": a}


def make_weight_quantizer(w: dict) -> WeightQuantizer:
    return WeightQuantizer(num_bits=w["num_bits"], strategy=w["strategy"], group_size=w.get("group_size"),
                           learn_amax=w.get("learn_amax", False))


def make_input_quantizer(a: Optional[dict]) -> QuantizerBase:
    if a is None:
        return IdentityQuantizer()
    if a["type"] == "actsulq":
        return ActsULQQuantizer(num_bits=a["num_bits"], fixed_min=a["fixed_min"], collect_loss=a.get("collect_loss", True))
    if a["dynamic"] == "token":
        return DynamicQuantizer(num_bits=a["num_bits"])
    if a["strategy"] != "tensor":
        raise ValueError(f"xquant.qat: config 'input_activations' strategy is {a['strategy']!r} but static activation "
                         "quantizers are per tensor ('tensor')")
    return TensorQuantizer(num_bits=a["num_bits"], axis=None, unsigned=a["unsigned"], narrow_range=a["narrow_range"],
                           calibrator=a["calibrator"], learn_amax=a["learn_amax"], calib_options=a["calib_options"])
