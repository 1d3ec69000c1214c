#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_model_dir.cpp into fuzz/corpus/model_dir/ (small files,
committed). Each file is one byte choosing the role of the rest (0: config.json of a plain model,
1: model.safetensors.index.json of a two-shard model, 2: config.json of a quantized model) followed by
the JSON text: valid files as transformers and compressed-tensors write them, the values Python's json
writes that strict JSON lacks (Infinity, NaN, integers beyond 64 bits), and the malformed or mistyped
cases of docs/cli.md ("Model directories"). Deterministic: running it again rewrites the same bytes.

    python3 fuzz/make_model_dir_corpus.py [OUT_DIR]
"""
import json
import os
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "model_dir")

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "rms_norm_eps": 1e-05,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32"}


def quantized(weights=None, **top):
    w = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": 8, "strategy": "group", "dynamic": False}
    w.update(weights or {})
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                        "output_activations": None}},
          "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None}
    qc.update(top)
    return dict(CONFIG, quantization_config=qc)


INDEX = {"metadata": {"total_size": 640}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                         "b.weight": "model-00002-of-00002.safetensors"}}


def text(obj, indent=2):
    return json.dumps(obj, indent=indent).encode()


SEEDS = {
    # mode 0: config.json of a plain model
    "config": (0, text(CONFIG)),
    "config-compact": (0, text(CONFIG, None)),
    "config-python-specials": (0, b'{"model_type": "llama", "a": Infinity, "b": -Infinity, "c": NaN, '
                                  b'"big": 123456789012345678901234567890, "esc": "caf\\u00e9 \\ud800"}'),
    "config-already-quantized": (0, text(quantized())),
    "config-deep": (0, b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}"),
    "config-duplicate": (0, b'{"model_type": "llama", "model_type": "bert"}'),
    "config-not-object": (0, b"[1, 2]"),
    "config-bom": (0, b"\xef\xbb\xbf{}"),
    "config-bad-utf8": (0, b'{"name": "\xff"}'),
    "config-tied": (0, text(dict(CONFIG, tie_word_embeddings=True, torch_dtype="bfloat16"))),
    "config-mistyped": (0, text(dict(CONFIG, tie_word_embeddings="yes", torch_dtype=16))),
    # mode 1: the index of a sharded model
    "index": (1, text(INDEX)),
    "index-missing-shard": (1, text({"weight_map": {"a.weight": "model-00003-of-00003.safetensors"}})),
    "index-path": (1, text({"weight_map": {"a.weight": "../model-00001-of-00002.safetensors"}})),
    "index-not-string": (1, text({"weight_map": {"a.weight": 1, "b.weight": None}})),
    "index-empty": (1, text({"weight_map": {}})),
    "index-deep": (1, b'{"weight_map": ' + b'{"x":' * 300 + b"1" + b"}" * 300 + b"}"),
    "index-duplicate": (1, b'{"weight_map": {"a.weight": "model-00001-of-00002.safetensors", '
                           b'"a.weight": "model-00002-of-00002.safetensors"}}'),
    "index-big-total": (1, text(dict(INDEX, metadata={"total_size": 10 ** 30}))),
    # mode 2: config.json of a quantized model
    "quantized": (2, text(quantized())),
    "quantized-channel": (2, text(quantized({"strategy": "channel", "group_size": None}))),
    "quantized-num-bits-fraction": (2, text(quantized({"num_bits": 4.7}))),
    "quantized-group-huge": (2, text(quantized({"group_size": 1e300}))),
    "quantized-group-big-int": (2, text(quantized({"group_size": 10 ** 20}))),
    "quantized-format-number": (2, text(quantized(format=5))),
    "quantized-symmetric-string": (2, text(quantized({"symmetric": "true"}))),
    "quantized-int8": (2, text(quantized({"num_bits": 8}, format="int-quantized"))),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (mode, body) in SEEDS.items():
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(bytes([mode]) + body)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
