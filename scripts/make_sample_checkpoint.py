#!/usr/bin/env python3
"""Writes data/sample.safetensors: a small transformer checkpoint for `xquant quantize`.

Shaped like a two-layer Llama/Qwen-style decoder (vocab 512, hidden 256, 4 heads, SwiGLU MLP 512): token
embedding, per layer attention q/k/v/o projections with q/k/v biases, gate/up/down MLP projections,
RMSNorm weights, a final norm, an untied lm_head and an int64 position-id buffer. Dtypes are mixed:
embedding and norms float32, layer 0 and lm_head bfloat16, layer 1 float16. The weights look like real
ones where it matters for quantization: per-output-channel magnitudes vary, two input features carry
outliers in the projections that read the residual stream, and one o_proj row is all zero (a pruned
channel: its scale must stay finite).

Reproducible to the byte: a fixed seed, NumPy's legacy RandomState (its stream is frozen by NumPy's
compatibility policy), and only exactly rounded arithmetic (normal-looking values are sums of twelve
uniforms, no transcendental functions, whose last bit may differ between math libraries). Written with
the official `safetensors` package. Needs numpy and safetensors only.

    python3 scripts/make_sample_checkpoint.py            # writes data/sample.safetensors
    python3 scripts/make_sample_checkpoint.py --check    # verifies the committed file is what it writes
"""
import argparse
import hashlib
import os
import sys
import tempfile

try:
    import numpy as np
    import safetensors  # noqa: F401 (checked here for the message; used by _safetensors_writer)
except ImportError as e:  # pragma: no cover
    sys.exit(f"make_sample_checkpoint.py needs numpy and safetensors (pip install numpy safetensors): {e}")
from _safetensors_writer import Gen, encode, linear, read, save

SEED = 20261129
VOCAB, HIDDEN, HEADS, FFN, LAYERS, POSITIONS = 512, 256, 4, 512, 2, 128
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "data", "sample.safetensors")


def build():
    g = Gen(SEED)
    t = {}  # name -> (dtype, float64 or int array)
    outliers = (17, 201)
    t["model.embed_tokens.weight"] = ("F32", g.normal((VOCAB, HIDDEN)) * 0.02)
    for i, dt in enumerate(["BF16", "F16"][:LAYERS]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("F32", 1.0 + 0.05 * g.normal((HIDDEN,)))
        for proj in ("q_proj", "k_proj", "v_proj"):
            t[p + f"self_attn.{proj}.weight"] = (dt, linear(g, HIDDEN, HIDDEN, 0.02, outliers))
            t[p + f"self_attn.{proj}.bias"] = (dt, 0.01 * g.normal((HIDDEN,)))
        o = linear(g, HIDDEN, HIDDEN, 0.02)
        if i == 1:
            o[5, :] = 0.0                            # a pruned output channel: all zero
        t[p + "self_attn.o_proj.weight"] = (dt, o)
        t[p + "post_attention_layernorm.weight"] = ("F32", 1.0 + 0.05 * g.normal((HIDDEN,)))
        t[p + "mlp.gate_proj.weight"] = (dt, linear(g, FFN, HIDDEN, 0.02, outliers))
        t[p + "mlp.up_proj.weight"] = (dt, linear(g, FFN, HIDDEN, 0.02, outliers))
        t[p + "mlp.down_proj.weight"] = (dt, linear(g, HIDDEN, FFN, 0.015))
    t["model.norm.weight"] = ("F32", 1.0 + 0.05 * g.normal((HIDDEN,)))
    t["lm_head.weight"] = ("BF16", g.normal((VOCAB, HIDDEN)) * 0.02)
    t["model.position_ids"] = ("I64", np.arange(POSITIONS, dtype=np.int64).reshape(1, POSITIONS))
    return t


# One entry only (see _safetensors_writer.save).
METADATA = {"format": "pt"}


def write(path):
    encoded = encode(build())
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".sample-", suffix=".tmp")
    os.close(fd)
    try:
        save(encoded, tmp, METADATA)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is not meant for a data file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return encoded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=DEFAULT_OUT, help="where to write (default: data/sample.safetensors)")
    ap.add_argument("--check", action="store_true",
                    help="write to a temporary file and verify that OUTPUT holds the same tensors and metadata")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as d:
            fresh = os.path.join(d, "sample.safetensors")
            write(fresh)
            if read(fresh) != read(args.output):
                sys.exit(f"{args.output} differs from what {os.path.basename(__file__)} writes")
        print(f"{args.output}: matches the generator")
        return
    write(args.output)
    size = os.path.getsize(args.output)
    with open(args.output, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"wrote {args.output}: {size} bytes, sha256 {digest}")


if __name__ == "__main__":
    main()
