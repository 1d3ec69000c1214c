"""Shared by make_sample_checkpoint.py and make_sample_model.py: reproducible weight generation and
safetensors writing / reading through the official `safetensors` package (numpy only, no PyTorch).

Reproducible to the byte: NumPy's legacy RandomState (its stream is frozen by NumPy's compatibility
policy) and only exactly rounded arithmetic (normal-looking values are sums of twelve uniforms, no
transcendental functions, whose last bit may differ between math libraries).
"""
import numpy as np
import safetensors


def to_bf16_bits(x32):
    """float32 -> bfloat16 bit patterns, round to nearest even (no NaN occurs here)."""
    u = x32.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Gen:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def normal(self, shape):
        """Approximately standard normal (Irwin-Hall, n = 12), in float64, exactly reproducible."""
        return self.rs.random_sample((12,) + tuple(shape)).sum(axis=0) - 6.0

    def uniform(self, shape, lo, hi):
        return lo + (hi - lo) * self.rs.random_sample(shape)


def linear(g, out_f, in_f, std, outlier_cols=(), outlier_gain=6.0):
    """A projection weight [out_f, in_f] that looks trained where it matters for quantization."""
    w = g.normal((out_f, in_f)) * std
    w *= g.uniform((out_f, 1), 0.5, 2.0)  # per-output-channel magnitudes differ
    for c in outlier_cols:                # outlier input features (residual stream)
        w[:, c] *= outlier_gain
    return w


def encode(tensors):
    """{name: (safetensors dtype F32 / F16 / BF16 / I64, float64 or int array)} ->
    {name: (dtype name for the Python API, shape, little-endian contiguous array)}."""
    out = {}
    for name, (dt, a) in tensors.items():
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
        out[name] = (api, list(a.shape), np.ascontiguousarray(arr))
    return out


def save(encoded, path, metadata):
    """Writes `encoded` (from encode()) with the official library, through whichever API this
    safetensors version has. Keep `metadata` to one entry: the official writer keeps metadata in a hash
    map, whose order (and so the bytes of the header) would change from run to run with several."""
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        specs = {n: safetensors.TensorSpec(dtype=api, shape=shape, data_ptr=arr.ctypes.data, data_len=arr.nbytes)
                 for n, (api, shape, arr) in encoded.items()}
    else:                                   # older versions take dicts with the bytes
        specs = {n: {"dtype": api, "shape": shape, "data": arr.tobytes()} for n, (api, shape, arr) in encoded.items()}
    safetensors.serialize_file(specs, path, metadata=metadata)


def read(path):
    """(metadata, {name: (dtype, shape, bytes)}) as the official library reads `path`."""
    with open(path, "rb") as f:
        data = f.read()
    tensors = {n: (v["dtype"], list(v["shape"]), bytes(v["data"])) for n, v in safetensors.deserialize(data)}
    with safetensors.safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    return meta, tensors
