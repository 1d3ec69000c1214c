#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_safetensors.cpp into fuzz/corpus/safetensors/ (small files,
committed): a valid tiny file of each dtype, files as the official writer lays them out (metadata,
several tensors, an empty one), a quantized file in xquant's format (int8 and int4), and malformed ones
(the bad-input cases of docs/cli.md). Deterministic: running it again rewrites the same bytes.

    python3 fuzz/make_safetensors_corpus.py [OUT_DIR]
"""
import json
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors")

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
        "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
        "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def header_bytes(header, pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-(8 + len(text)) % 8)
    return text


def file_bytes(header, data=b"", length=None, pad=True):
    text = header_bytes(header, pad)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def pattern(n, seed=1):
    """n deterministic bytes."""
    out = bytearray()
    x = seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 16) & 0xFF)
    return bytes(out)


def f32(values):
    return b"".join(struct.pack("<f", v) for v in values)


def layout(tensors, metadata=None):
    """tensors: [(name, dtype, shape, data)] in data order -> file bytes."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    data = b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    return file_bytes(header, data)


def main():
    os.makedirs(OUT, exist_ok=True)
    files = {}
    # One valid tiny file per dtype.
    for dt, bits in BITS.items():
        shape = [2, 8]
        files[f"dtype-{dt}"] = layout([("t", dt, shape, pattern(16 * bits // 8, bits))])
    # Quantizable weights with metadata, a bias, a scalar and an empty tensor, as the official writer orders them.
    w = [((i * 37) % 17 - 8) / 8.0 for i in range(64)]
    files["model-f32"] = layout([("layer.weight", "F32", [8, 8], f32(w)), ("layer.bias", "F32", [8], f32(w[:8])),
                                 ("step", "I64", [], struct.pack("<q", 7)), ("empty", "F32", [0, 4], b"")],
                                {"format": "pt"})
    files["model-bf16-3d"] = layout([("experts", "BF16", [2, 4, 16], pattern(256, 3))])
    files["model-f16-nan"] = layout([("w", "F16", [2, 8], struct.pack("<16H", *([0x7E00, 0x7C00, 0xFC00, 0x3C00] * 4)))])
    # xquant's quantized format: int8 per-channel symmetric, and int4 per-tensor asymmetric.
    q8 = bytes((i * 7) % 256 for i in range(32))
    files["quantized-int8"] = layout(
        [("w.scale", "F32", [4, 1], f32([0.01, 0.02, 0.03, 0.04])), ("w", "I8", [4, 8], q8)],
        {"xquant.format_version": "1", "xquant.version": "0.1.0", "xquant.bits": "8", "xquant.scheme": "per-channel",
         "xquant.axis": "0", "xquant.mode": "symmetric",
         "xquant.tensors": json.dumps({"w": {"dtype": "F32", "shape": [4, 8], "axis": 0}}, separators=(",", ":"))})
    files["quantized-int4"] = layout(
        [("w", "I32", [2, 2], pattern(16, 5)), ("w.scale", "F32", [1, 1], f32([0.5])),
         ("w.zero_point", "F32", [1, 1], f32([1.25]))],
        {"xquant.format_version": "1", "xquant.version": "0.1.0", "xquant.bits": "4", "xquant.scheme": "per-tensor",
         "xquant.axis": "none", "xquant.mode": "asymmetric",
         "xquant.tensors": json.dumps({"w": {"dtype": "BF16", "shape": [2, 16], "axis": None}}, separators=(",", ":"))})
    # Malformed files.
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    files["bad-truncated"] = file_bytes(good, b"\0" * 12)
    files["bad-short"] = b"\x10\0\0\0\0"
    files["bad-length"] = file_bytes(good, b"\0" * 16, length=10_000)
    files["bad-json"] = file_bytes(b'{"w": {"dtype": "F32", "shape": [2, 2]', b"\0" * 16, pad=False)
    files["bad-bom"] = file_bytes(b"\xef\xbb\xbf" + header_bytes(good, False), b"\0" * 16, pad=False)
    files["bad-nul"] = file_bytes(header_bytes(good, False) + b"\0\0\0", b"\0" * 16, pad=False)
    files["bad-duplicate-key"] = file_bytes(b'{"w":{"dtype":"F32","dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}',
                                            b"\0" * 16)
    files["bad-hole"] = file_bytes({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [4, 20]}}, b"\0" * 20)
    files["bad-overlap"] = file_bytes({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16)
    files["bad-size"] = file_bytes({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, b"\0" * 16)
    files["bad-deep"] = file_bytes(b'{"w":{"dtype":"F32","shape":' + b"[" * 64 + b"]" * 64 + b',"data_offsets":[0,16]}}',
                                   b"\0" * 16)
    files["bad-metadata"] = file_bytes({"__metadata__": {"k": 1}})
    files["bad-rank"] = file_bytes({"w": {"dtype": "F32", "shape": [1] * 100 + [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16)
    files["bad-quant-metadata"] = layout(
        [("w", "I8", [4, 8], q8), ("w.scale", "F32", [4, 1], f32([1, 2, 3, 4]))],
        {"xquant.format_version": "1", "xquant.bits": "8", "xquant.scheme": "per-channel", "xquant.axis": "0",
         "xquant.mode": "symmetric", "xquant.tensors": '{"w":{"dtype":"F32","shape":[4,8],"axis":5}}'})
    for name, content in sorted(files.items()):
        with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
            f.write(content)
    print(f"{len(files)} files in {OUT}")


if __name__ == "__main__":
    main()
