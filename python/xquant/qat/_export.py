"""export: a prepared model as a compressed-tensors checkpoint (the CLI's writer semantics, docs/cli.md)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Optional

import torch
from torch import nn

from ._modules import QuantLinear, QuantModuleMixin
from ._prepare import quant_modules, quantizers
from ._quantizer import ActsULQQuantizer, DynamicQuantizer, TensorQuantizer, WeightQuantizer
from ._config import IdentityQuantizer

__all__ = ["export", "export_state_dict"]

_DT_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """compressed-tensors pack_to_int32 of a [N, K] int tensor: q + 2^(b-1) unsigned, element i of a row in
    bits [b*i mod 32, ...) of word b*i / 32, words little-endian int32."""
    n, k = q.shape
    per = 32 // bits
    u = (q.to(torch.int64) + (1 << (bits - 1))).reshape(n, k // per, per)
    shifts = torch.arange(per, dtype=torch.int64, device=q.device) * bits
    words = (u << shifts).sum(dim=-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    return words.to(torch.int32)


def actsulq_qparams(iq: ActsULQQuantizer, dtype: torch.dtype = torch.float32):
    """(scale, zero_point) of an 8-bit ActsULQ range as compressed-tensors' asymmetric int8: ActsULQ's grid
    is ``s * k`` for ``k`` in ``[off, off + 255]`` (docs/semantics.md 6.1: ``s = (ori_max - ori_min) / 255``,
    ``off = rint(ori_min / s)``), which is ``(q - zp) * s`` for ``q`` in ``[-128, 127]`` with ``zp = -off - 128``.
    The clamps are first rounded to ``dtype``, the activations' dtype, as the forward passes them."""
    levels = float((1 << iq.num_bits) - 1)
    lo = iq.clamp_min.detach().float().reshape(1)
    hi = iq.clamp_max.detach().float().reshape(1)
    lo = (lo.full_tensor() if hasattr(lo, "full_tensor") else lo).to(dtype).float()
    hi = (hi.full_tensor() if hasattr(hi, "full_tensor") else hi).to(dtype).float()
    eps = torch.tensor(2.0 ** -23, dtype=torch.float32)
    ori_min = torch.zeros_like(lo) if iq.fixed_min else torch.minimum(lo, torch.zeros_like(lo))
    ori_max = torch.maximum(hi, levels * eps)
    s = (ori_max - ori_min) / levels
    off = torch.round(ori_min / s)
    return s, (-off - 128).to(torch.int8)


def _weights_args(wq: WeightQuantizer) -> dict:
    strategy = wq.strategy
    return {"num_bits": wq.num_bits, "type": "int", "symmetric": True,
            "group_size": wq.group_size if strategy == "group" else None, "strategy": strategy, "dynamic": False}


def _input_args(iq) -> Optional[dict]:
    if isinstance(iq, IdentityQuantizer) or iq.mode == "disabled":
        return None
    if isinstance(iq, DynamicQuantizer):
        return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    if isinstance(iq, TensorQuantizer):
        if iq.unsigned or iq.num_bits != 8:
            raise ValueError(f"xquant.qat.export: quantizer {iq.qname}: only signed 8-bit static activation "
                             "quantizers map to compressed-tensors (got num_bits="
                             f"{iq.num_bits}, unsigned={iq.unsigned})")
        return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor", "dynamic": False}
    if isinstance(iq, ActsULQQuantizer):
        if iq.num_bits != 8:
            raise ValueError(f"xquant.qat.export: quantizer {iq.qname}: ActsULQ with num_bits={iq.num_bits} has no "
                             "compressed-tensors form (8 bits map to asymmetric int8); disable the input quantizers "
                             "(xquant.qat.set_quantizer_mode(model, 'disabled', 're:.*input_quantizer')) to export "
                             "the weights only")
        return {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "tensor", "dynamic": False}
    raise ValueError(f"xquant.qat.export: quantizer {getattr(iq, 'qname', '?')} of type {type(iq).__name__} cannot be exported")


def _unwrap(model: nn.Module) -> nn.Module:
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):  # torch.compile's wrapper
            model = model._orig_mod
        else:
            return model


@torch.no_grad()
def export_state_dict(model: nn.Module):
    """(tensors, quantization_config): the checkpoint's tensors (CPU, contiguous) and config.json's
    ``quantization_config``. Validates everything first (finite scales, one format); raises ValueError.
    A DDP wrapper or a torch.compile'd module is unwrapped first."""
    model = _unwrap(model)
    for n, q in quantizers(model):
        q.qname = n
    qmods = dict(quant_modules(model))
    groups: dict = {}  # (weights args, input args) json -> [module names]
    dense_linear = []
    sd = model.state_dict()
    drop = set()
    out: dict = {}
    for name, mod in model.named_modules():
        if name and isinstance(mod, nn.Linear) and not (isinstance(mod, QuantLinear)
                                                       and mod.weight_quantizer.mode != "disabled"):
            dense_linear.append(name)
    fmt = None
    for name, mod in qmods.items():
        wq: WeightQuantizer = mod.weight_quantizer
        for k in list(sd):
            if k.startswith(name + ".weight_quantizer.") or k.startswith(name + ".input_quantizer."):
                drop.add(k)
        w = mod.weight.detach()
        if hasattr(w, "full_tensor"):
            w = w.full_tensor()
        if wq.mode == "disabled":
            continue
        if not wq.is_calibrated():
            raise ValueError(f"xquant.qat.export: quantizer {wq.qname} has no amax (calibrate first)")
        wq.check_scales(w)
        if not isinstance(mod, QuantLinear):
            # convolutions: written dense with the weights the model computes with (not in the config)
            out[name + ".weight"] = mod.quantized_weight().detach()
            drop.add(name + ".weight")
            continue
        wargs = _weights_args(wq)
        iargs = _input_args(mod.input_quantizer)
        packed = not (wq.num_bits == 8 and iargs is not None)
        f = "pack-quantized" if packed else "int-quantized"
        if fmt is not None and f != fmt:
            raise ValueError(f"xquant.qat.export: module {name!r} needs format {f!r} but earlier modules "
                             f"{fmt!r} (one format per checkpoint)")
        fmt = f
        groups.setdefault(json.dumps([wargs, iargs]), []).append(name)
        q = wq.integers(w)
        s = wq.scales(w).to(w.dtype)
        drop.add(name + ".weight")
        if packed:
            out[name + ".weight_packed"] = _pack(q, wq.num_bits)
            out[name + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
        else:
            out[name + ".weight"] = q.to(torch.int8)
        out[name + ".weight_scale"] = s
        iq = mod.input_quantizer
        if isinstance(iq, ActsULQQuantizer) and iargs is not None:
            if not iq.is_calibrated():
                raise ValueError(f"xquant.qat.export: quantizer {iq.qname} has no clamp range (calibrate first)")
            sc, zp = actsulq_qparams(iq, w.dtype)
            sc = sc.to(w.dtype)
            if not bool(torch.isfinite(sc).all()) or float(sc) == 0:
                raise ValueError(f"xquant.qat.export: quantizer {iq.qname}: its clamp range gives the scale "
                                 f"{float(sc)} in {w.dtype} (expected finite and non-zero)")
            out[name + ".input_scale"] = sc
            out[name + ".input_zero_point"] = zp
        elif iargs is not None and not iargs["dynamic"]:
            if not iq.is_calibrated():
                raise ValueError(f"xquant.qat.export: quantizer {iq.qname} has no amax (calibrate first)")
            a = iq.amax.detach().float().reshape(1).clamp_min(0)
            sc = (a / 127.0).to(w.dtype)
            if not bool(torch.isfinite(sc).all()):
                raise ValueError(f"xquant.qat.export: quantizer {iq.qname}: amax {float(a)} gives a scale that "
                                 f"overflows {w.dtype}")
            out[name + ".input_scale"] = sc
    if fmt is None:
        raise ValueError("xquant.qat.export: the model has no enabled quantized Linear module to export")
    for k, v in sd.items():
        if k in drop or k in out:
            continue
        if ".weight_quantizer." in k or ".input_quantizer." in k:
            continue
        out[k] = v.detach()
    # tied weights (transformers): the loader ties lm_head to the embedding; write the tensor once
    cfg = getattr(model, "config", None)
    if getattr(cfg, "tie_word_embeddings", False) and "lm_head.weight" in out:
        out.pop("lm_head.weight")
    out = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu().contiguous() for k, v in out.items()}
    groups_cfg = {}
    single = len(groups) == 1
    for i, (key, names) in enumerate(groups.items()):
        wargs, iargs = json.loads(key)
        groups_cfg[f"group_{i}"] = {"targets": ["Linear"] if single else sorted(names), "weights": wargs,
                                    "input_activations": iargs, "output_activations": None}
    qc = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
          "config_groups": groups_cfg, "ignore": sorted(dense_linear), "kv_cache_scheme": None,
          "global_compression_ratio": None}
    return out, qc


def _model_dtype(model: nn.Module) -> Optional[torch.dtype]:
    dts = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return dts.pop() if len(dts) == 1 else None


def export(model: nn.Module, out_dir, *, force: bool = False) -> str:
    """Write ``model`` as a compressed-tensors checkpoint directory ``out_dir``: ``model.safetensors``
    (quantized Linear modules as the CLI writes them, from the quantizers' amax: scales in the weight's dtype,
    ``weight_packed`` / ``weight_scale`` / ``weight_shape`` or int8 ``weight``; every other tensor as the
    model holds it; convolutions dense, with their fake-quantized weights) and ``config.json`` (the model's
    transformers config, if it has one, plus ``quantization_config``; its dtype set to the weights' dtype),
    and ``generation_config.json`` when the model has one. The weights transformers decompresses equal the
    weights the model computes with, bit for bit.

    Everything is validated and computed first, written into a temporary directory beside ``out_dir`` and
    renamed into place; an existing ``out_dir`` is a FileExistsError unless ``force`` (then it is replaced
    only once the new one is complete). On any error nothing is left behind.

    With ``torch.distributed`` initialized (more than one rank) call it on every rank: the tensors are
    gathered on all of them (FSDP2's DTensors) and only rank 0 writes."""
    from safetensors.torch import save_file

    out_dir = os.fspath(out_dir)
    d = torch.distributed
    writer = not (d.is_available() and d.is_initialized() and d.get_world_size() > 1) or d.get_rank() == 0
    if writer and os.path.lexists(out_dir) and not force and not (d.is_available() and d.is_initialized()):
        raise FileExistsError(f"xquant.qat.export: out_dir {out_dir!r} exists (pass force=True to replace it)")
    model = _unwrap(model)
    tensors, qc = export_state_dict(model)  # every rank: the gathers are collectives
    if not writer:
        return out_dir
    if os.path.lexists(out_dir) and not force:
        raise FileExistsError(f"xquant.qat.export: out_dir {out_dir!r} exists (pass force=True to replace it)")
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):
        conf = cfg.to_dict()
        dt = _model_dtype(model)
        if dt is not None:
            for key in ("torch_dtype", "dtype"):
                if key in conf or key == "dtype":
                    conf[key] = _DT_NAME.get(dt, conf.get(key))
        conf.pop("quantization_config", None)
    else:
        conf = {}
    conf["quantization_config"] = qc
    parent = os.path.dirname(os.path.abspath(out_dir))
    base = os.path.basename(os.path.abspath(out_dir))
    tmp = tempfile.mkdtemp(prefix=f".{base}.xquant-", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(conf, f, indent=2, sort_keys=True)
            f.write("\n")
        gen = getattr(model, "generation_config", None)
        if gen is not None and hasattr(gen, "to_json_file"):
            gen.to_json_file(os.path.join(tmp, "generation_config.json"))
        old = None
        if os.path.lexists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{base}.xquant-old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "x"))
        try:
            os.rename(tmp, out_dir)
        except BaseException:
            if old is not None:
                os.rename(os.path.join(old, "x"), out_dir)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
