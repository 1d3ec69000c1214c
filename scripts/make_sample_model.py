#!/usr/bin/env python3
"""Writes data/sample-model/: a small Hugging Face model directory for `xquant quantize DIR -o OUT`.

A real transformers architecture (LlamaForCausalLM: 2 layers, hidden 256, 4 attention heads with 2
key/value heads, SwiGLU MLP 512, vocabulary 512, untied lm_head), bfloat16 weights, so that
`AutoModelForCausalLM.from_pretrained` loads it and its quantized versions. Files: config.json,
generation_config.json and model.safetensors (about 2.9 MB); no tokenizer (token ids go in directly).

The weights look like trained ones where it matters for quantization: per-output-channel magnitudes
differ, two input features of the projections that read the residual stream carry outliers, norms are
near 1. Reproducible to the byte: a fixed seed, NumPy's legacy RandomState (its stream is frozen by
NumPy's compatibility policy), only exactly rounded arithmetic (normal-looking values are sums of twelve
uniforms), one metadata entry. Needs numpy and safetensors only (no PyTorch).

    python3 scripts/make_sample_model.py            # writes data/sample-model/
    python3 scripts/make_sample_model.py --check    # verifies the committed files are what it writes
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

try:
    import numpy  # noqa: F401 (checked here for the message; used by _safetensors_writer)
    import safetensors  # noqa: F401
except ImportError as e:  # pragma: no cover
    sys.exit(f"make_sample_model.py needs numpy and safetensors (pip install numpy safetensors): {e}")
from _safetensors_writer import Gen, encode, linear, read, save

SEED = 20261201
VOCAB, HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 512, 256, 4, 2, 512, 2
HEAD_DIM = HIDDEN // HEADS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "data", "sample-model")

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "initializer_range": 0.02,
    "intermediate_size": FFN,
    "max_position_embeddings": 512,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": KV_HEADS,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": VOCAB,
}
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}


def build():
    g = Gen(SEED)
    t = {}
    outliers = (17, 201)
    t["model.embed_tokens.weight"] = g.normal((VOCAB, HIDDEN)) * 0.02
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + 0.05 * g.normal((HIDDEN,))
        t[p + "self_attn.q_proj.weight"] = linear(g, HEADS * HEAD_DIM, HIDDEN, 0.02, outliers)
        t[p + "self_attn.k_proj.weight"] = linear(g, KV_HEADS * HEAD_DIM, HIDDEN, 0.02, outliers)
        t[p + "self_attn.v_proj.weight"] = linear(g, KV_HEADS * HEAD_DIM, HIDDEN, 0.02, outliers)
        t[p + "self_attn.o_proj.weight"] = linear(g, HIDDEN, HEADS * HEAD_DIM, 0.02)
        t[p + "post_attention_layernorm.weight"] = 1.0 + 0.05 * g.normal((HIDDEN,))
        t[p + "mlp.gate_proj.weight"] = linear(g, FFN, HIDDEN, 0.02, outliers)
        t[p + "mlp.up_proj.weight"] = linear(g, FFN, HIDDEN, 0.02, outliers)
        t[p + "mlp.down_proj.weight"] = linear(g, HIDDEN, FFN, 0.015)
    t["model.norm.weight"] = 1.0 + 0.05 * g.normal((HIDDEN,))
    t["lm_head.weight"] = g.normal((VOCAB, HIDDEN)) * 0.02
    return encode({n: ("BF16", a) for n, a in t.items()})


def write(out_dir):
    """Writes the directory atomically (a temporary directory beside it, renamed into place)."""
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".sample-model-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        save(build(), os.path.join(tmp, "model.safetensors"), {"format": "pt"})
        for name, obj in (("config.json", CONFIG), ("generation_config.json", GENERATION_CONFIG)):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)


def content(d):
    """Every file of the directory: JSON files parsed, the weights as the official library reads them."""
    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if name.endswith(".json"):
            with open(p) as f:
                out[name] = json.load(f)
        else:
            out[name] = read(p)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=DEFAULT_OUT, help="where to write (default: data/sample-model)")
    ap.add_argument("--check", action="store_true", help="verify that OUTPUT holds what this script writes")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            fresh = os.path.join(d, "sample-model")
            write(fresh)
            if content(fresh) != content(args.output):
                sys.exit(f"{args.output} differs from what {os.path.basename(__file__)} writes")
        print(f"{args.output}: matches the generator")
        return
    write(args.output)
    size = sum(os.path.getsize(os.path.join(args.output, n)) for n in os.listdir(args.output))
    print(f"wrote {args.output}: {len(os.listdir(args.output))} files, {size} bytes")


if __name__ == "__main__":
    main()
