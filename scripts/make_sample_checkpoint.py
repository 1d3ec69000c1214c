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
    import safetensors
except ImportError as e:  # pragma: no cover
    sys.exit(f"make_sample_checkpoint.py needs numpy and safetensors (pip install numpy safetensors): {e}")

SEED = 20261129
VOCAB, HIDDEN, HEADS, FFN, LAYERS, POSITIONS = 512, 256, 4, 512, 2, 128
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "data", "sample.safetensors")


def to_bf16_bits(x32):
    """float32 -> bfloat16 bit patterns, round to nearest even (no NaN occurs here)."""
    u = x32.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Gen:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def normal(self, shape):
        """Approximately standard normal (Irwin-Hall, n = 12), in float64, exactly reproducible."""
        u = self.rs.random_sample((12,) + tuple(shape))
        return u.sum(axis=0) - 6.0

    def uniform(self, shape, lo, hi):
        return lo + (hi - lo) * self.rs.random_sample(shape)


def linear(g, out_f, in_f, std, outlier_cols=(), outlier_gain=6.0):
    w = g.normal((out_f, in_f)) * std
    w *= g.uniform((out_f, 1), 0.5, 2.0)          # per-output-channel magnitudes differ
    for c in outlier_cols:                           # outlier input features (residual stream)
        w[:, c] *= outlier_gain
    return w


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


def encode(t):
    """name -> (safetensors dtype name for the Python API, shape, little-endian bytes)."""
    out = {}
    for name, (dt, a) in t.items():
        if dt == "F32":
            arr, api = a.astype("<f4"), "float32"
        elif dt == "F16":
            arr, api = a.astype("<f4").astype("<f2"), "float16"
        elif dt == "BF16":
            arr, api = to_bf16_bits(a.astype("<f4")).astype("<u2"), "bfloat16"
        elif dt == "I64":
            arr, api = a.astype("<i8"), "int64"
        else:
            raise ValueError(dt)
        arr = np.ascontiguousarray(arr)
        out[name] = (api, list(a.shape), arr)
    return out


def save(encoded, path, metadata):
    """Writes with the official library, through whichever API this safetensors version has."""
    if hasattr(safetensors, "TensorSpec"):   # safetensors >= 0.8
        specs = {n: safetensors.TensorSpec(dtype=api, shape=shape, data_ptr=arr.ctypes.data, data_len=arr.nbytes)
                 for n, (api, shape, arr) in encoded.items()}
        safetensors.serialize_file(specs, path, metadata=metadata)
    else:                                    # older versions take dicts with the bytes
        specs = {n: {"dtype": api, "shape": shape, "data": arr.tobytes()} for n, (api, shape, arr) in encoded.items()}
        safetensors.serialize_file(specs, path, metadata=metadata)


# One entry only: the official writer keeps metadata in a hash map, whose order (and so the bytes of
# the header) would change from run to run with several entries.
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


def content(path):
    """(metadata, {name: (dtype, shape, bytes)}) as the official library reads it."""
    with open(path, "rb") as f:
        data = f.read()
    tensors = {n: (v["dtype"], list(v["shape"]), bytes(v["data"])) for n, v in safetensors.deserialize(data)}
    with safetensors.safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    return meta, tensors


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
            if content(fresh) != content(args.output):
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
