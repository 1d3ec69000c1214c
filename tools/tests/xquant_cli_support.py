"""Helpers of the xquant CLI's Python tests: the binary, crafted files, and an independent reader side
(the official safetensors package and NumPy). A missing dependency raises at import, so the CTest test
fails with this message instead of skipping."""
import json
import os
import struct
import subprocess

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    raise ImportError(
        f"the xquant CLI tests need numpy, safetensors and pytest (pip install numpy safetensors pytest): {e}"
    ) from e

XQ = os.environ.get("XQUANT_CLI", "")
if not XQ or not os.access(XQ, os.X_OK):
    raise RuntimeError(
        f"XQUANT_CLI must name the built xquant binary (ctest sets it), got {XQ!r}; "
        "e.g. XQUANT_CLI=build/release/tools/xquant python3 -m pytest tools/tests"
    )
ROOT = os.environ.get("XQUANT_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "data", "sample.safetensors")


def xquant(*args, **kw):
    """Runs the binary; returns CompletedProcess with text stdout / stderr."""
    return subprocess.run([XQ, *map(str, args)], capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


def raw_file(path, header, data=b"", length=None):
    """A crafted file: 8-byte little-endian length (of the JSON unless `length`), the JSON text, data."""
    text = header if isinstance(header, (bytes, str)) else json.dumps(header)
    text = text.encode() if isinstance(text, str) else text
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text) if length is None else length))
        f.write(text)
        f.write(data)
    return path


# ---- bfloat16 without torch ----

def bf16_bits_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def save_official(path, tensors, metadata=None):
    """Writes with the official library. tensors: name -> (dtype 'F32'|'F16'|'BF16'|'I64'|..., array).
    BF16 arrays are given as float32 values and rounded to bfloat16 here."""
    api = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I8": "int8", "U8": "uint8", "BOOL": "bool", "F64": "float64"}
    enc = {}
    for name, (dt, a) in tensors.items():
        if dt == "BF16":
            arr = f32_to_bf16_bits(a)
        else:
            arr = np.ascontiguousarray(np.asarray(a).astype(np.dtype(api[dt]).newbyteorder("<")))
        enc[name] = (api[dt], list(np.shape(a)), np.ascontiguousarray(arr))
    if hasattr(safetensors, "TensorSpec"):
        specs = {n: safetensors.TensorSpec(dtype=t, shape=s, data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for n, (t, s, a) in enc.items()}
    else:
        specs = {n: {"dtype": t, "shape": s, "data": a.tobytes()} for n, (t, s, a) in enc.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)


NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
      "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_, "I16": np.int16, "U16": np.uint16}


def read_official(path):
    """Everything in a file as the official library reads it: (metadata, {name: (dtype, array)}). BF16
    tensors come back widened to float32 (NumPy has no bfloat16)."""
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for name, v in safetensors.deserialize(data):
        dt, shape = v["dtype"], v["shape"]
        if dt == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(bytes(v["data"]), dtype="<u2")).reshape(shape)
        else:
            arr = np.frombuffer(bytes(v["data"]), dtype=np.dtype(NP[dt]).newbyteorder("<")).reshape(shape)
        out[name] = (dt, arr)
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
    return meta, out


# ---- the quantized format, decoded independently of xquant ----

def unpack_int4(words, last):
    """quint4x2: eight int4 per int32 word along the last dimension, element 8k+j in bits [4j, 4j+3] of
    word k, two's complement nibbles."""
    w = np.asarray(words).astype(np.int64).astype(np.uint32)[..., None]
    nib = ((w >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).astype(np.int16)
    vals = np.where(nib >= 8, nib - 16, nib).astype(np.int8)
    return vals.reshape(*np.shape(words)[:-1], last)


def rne(v):
    """Round half to even (NumPy's rint is IEEE round-to-nearest-even)."""
    return np.rint(v)


def expected_q(x32, scale, zp, bits):
    """The stored integers by the formula of docs/cli.md, in float32 NumPy arithmetic: int8 rint(x / s + zp)
    (npu_quantize div_mode=True), int4 rint(x * (1 / s) + zp) (div_mode=False), saturated."""
    x32 = np.asarray(x32, dtype=np.float32)
    s = np.asarray(scale, dtype=np.float32)
    z = np.asarray(zp, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        v = (x32 / s + z) if bits == 8 else (x32 * (np.float32(1) / s) + z)
        v = v.astype(np.float32)
        lo, hi = (-128, 127) if bits == 8 else (-8, 7)
        q = np.clip(rne(v), lo, hi)
        q = np.where(np.isnan(v), 0, q)
    return q.astype(np.int32)


def dequantized(q, scale, zp):
    """x' = (q - zero_point) * scale in float32."""
    return ((np.asarray(q).astype(np.float32) - np.asarray(zp, dtype=np.float32)) * np.asarray(scale, dtype=np.float32)).astype(np.float32)


def stored_ints(meta, tensors, name):
    bits = int(meta["xquant.bits"])
    dt, q = tensors[name]
    info = json.loads(meta["xquant.tensors"])[name]
    if bits == 4:
        assert dt == "I32"
        return unpack_int4(q, info["shape"][-1])
    assert dt == "I8"
    return q.astype(np.int32)
