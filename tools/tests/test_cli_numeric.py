"""The numbers of the compressed-tensors path (issue 17, part 2; issue 22, item 4), end to end through the
built binary, with NumPy and the official safetensors package as the independent side.

- scales that the scale dtype cannot hold are refused, never written as +-Inf (issue 17.1);
- the report never shows a NaN or an overflowed sum as an exact round trip (issue 17.1);
- a compressed module of input width 0 is refused, not a SIGFPE (issue 17.2);
- a dense and a compressed tensor of the same name are refused, never written twice (issue 17.3);
- GPTQ's weight_g_idx (activation ordering) is applied when dequantizing (issue 17.4);
- a [1, 2^28] weight is quantized in bounded memory (issue 17.5);
- the sample model's outputs are byte for byte those of the code before issue 22's rewrite (issue 22.4).
"""
import hashlib
import json
import os
import struct
import subprocess

import pytest

from xquant_cli_support import ROOT, XQ, bf16_bits_to_f32, f32_to_bf16_bits, np, read_official, save_official, xquant

SAMPLE_MODEL = os.path.join(ROOT, "data", "sample-model")
SAMPLE_FILE = os.path.join(ROOT, "data", "sample.safetensors")
UP = "model.layers.0.mlp.up_proj"


def write_model(d, tensors, config):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    save_official(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})


def leftovers(parent):
    return [e for e in os.listdir(parent) if ".xquant-" in e]


def refused(r, out, *needles):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("xquant: error:"), r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert not os.path.exists(out)
    assert not leftovers(os.path.dirname(out))


# ---------------------------------------------------------------------------------------------------
# 17.1: a scale the scale dtype cannot hold.

@pytest.mark.parametrize("preset,value", [("W4A16", 1.0e6), ("W8A16", 1.0e7), ("W8A8", 1.0e7), ("W4A16", 7.0e4)])
def test_scale_overflow_is_refused(tmp_path, preset, value):
    """A float16 model (scales stored in float16) with float32 weights too large for it: amax / qmax
    rounds to +Inf in float16 (1e6 / 7, 1e7 / 127), or the scale is finite but the largest dequantized
    value qmax * s' is not (7e4 / 7 = 1e4, 7 * 1e4 > 65504). Before the fix: exit 0, a scale of +Inf,
    every dequantized value NaN, and the report said SQNR "inf"."""
    rs = np.random.RandomState(3)
    w = rs.standard_normal((8, 128)).astype(np.float32) * 0.05
    w[5, 17] = value
    src = tmp_path / "m"
    write_model(src, {UP + ".weight": ("F32", w)}, {"model_type": "llama", "torch_dtype": "float16"})
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--preset", preset)
    refused(r, str(out), f"'{UP}.weight'", "F16", "row 5")


def test_large_weights_with_bfloat16_scales(tmp_path):
    """bfloat16 scales hold weights of 1e30; the round-trip error sums (squares near 1e60) overflowed
    float32 and the report printed SQNR "inf" for what is an ordinary int8 rounding error."""
    rs = np.random.RandomState(4)
    w = rs.standard_normal((8, 256)).astype(np.float32) * np.float32(1e30)
    src = tmp_path / "m"
    write_model(src, {UP + ".weight": ("BF16", w)}, {"model_type": "llama", "torch_dtype": "bfloat16"})
    out = tmp_path / "out"
    rep = tmp_path / "r.json"
    r = xquant("quantize", src, "-o", out, "--preset", "W8A16", "--report", rep)
    assert r.returncode == 0, r.stderr
    (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith(UP)]
    assert " inf " not in row + " " and "exact" not in row, row
    j = json.loads(rep.read_text())
    (t,) = [t for t in j["tensors"] if t["action"] == "quantized"]
    assert t["sqnr_db"] is not None and 30 < t["sqnr_db"] < 60, t
    assert t["round_trip"] == "lossy" and np.isfinite(t["max_abs_error"]) and t["max_abs_error"] > 1e26


def test_exact_round_trip_is_said_so(tmp_path):
    """An all-zero weight round-trips exactly: the report says "exact", not "inf"."""
    w = np.zeros((8, 128), np.float32)
    src = tmp_path / "m"
    write_model(src, {UP + ".weight": ("F32", w)}, {"model_type": "llama", "torch_dtype": "float32"})
    rep = tmp_path / "r.json"
    r = xquant("quantize", src, "-o", tmp_path / "out", "--report", rep)
    assert r.returncode == 0, r.stderr
    (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith(UP)]
    assert "exact" in row and "inf" not in row, row
    assert "SQNR exact" in r.stdout and "inf" not in r.stdout, r.stdout
    (t,) = [t for t in json.loads(rep.read_text())["tensors"] if t["action"] == "quantized"]
    assert t["sqnr_db"] is None and t["round_trip"] == "exact" and t["max_abs_error"] == 0


# ---------------------------------------------------------------------------------------------------
# Compressed-tensors directories written here (the reading side).

def ct_config(fmt, bits, group, actorder=None):
    w = {"num_bits": bits, "type": "int", "symmetric": True, "dynamic": False,
         "strategy": "channel" if group == 0 else "group", "group_size": group or None}
    if actorder is not None:
        w["actorder"] = actorder
    return {"model_type": "llama", "torch_dtype": "bfloat16", "quantization_config": {
        "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                      "output_activations": None}},
        "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None}}


def pack(q, bits):
    """compressed-tensors pack_to_int32: q + 2^(b-1) unsigned, element i at bits [b*i mod 32, ...)."""
    n, k = q.shape
    per = 32 // bits
    u = (q.astype(np.int64) + (1 << (bits - 1))).astype(np.uint32).reshape(n, k // per, per)
    words = np.zeros((n, k // per), np.uint32)
    for j in range(per):
        words |= u[:, :, j] << np.uint32(bits * j)
    return words.view(np.int32)


# 17.2: input width 0.

@pytest.mark.parametrize("group", [0, 128])
def test_zero_width_module_is_refused(tmp_path, group):
    """An int-quantized module whose weight is [4, 0]: a division by zero (SIGFPE) before the fix, in
    dequantize DIR, dequantize FILE and inspect DIR."""
    src = tmp_path / "m"
    ts = {UP + ".weight": ("I8", np.zeros((4, 0), np.int8)),
          UP + ".weight_scale": ("BF16", np.ones((4, 1 if group == 0 else 0), np.float32)),
          "model.norm.weight": ("BF16", np.ones(8, np.float32))}
    write_model(src, ts, ct_config("int-quantized", 8, group))
    out = tmp_path / "out"
    refused(xquant("dequantize", src, "-o", out), str(out), f"'{UP}.weight'", "input width 0")
    r = xquant("inspect", src)
    assert r.returncode == 1 and "input width 0" in r.stderr, (r.returncode, r.stderr)
    if group == 0:  # a single file: the quantization is read from its tensors
        outf = tmp_path / "out.safetensors"
        refused(xquant("dequantize", src / "model.safetensors", "-o", outf), str(outf), "input width 0")


# 17.3: one name, two tensors.

def packed_module(rs, n, k, bits=4, group=32):
    q = rs.randint(-(1 << (bits - 1)), 1 << (bits - 1), (n, k)).astype(np.int32)
    s = (rs.uniform(0.5, 2.0, (n, k // group)) * 0.01).astype(np.float32)
    return q, s, {UP + ".weight_packed": ("I32", pack(q, bits)), UP + ".weight_scale": ("BF16", s),
                  UP + ".weight_shape": ("I64", np.array([n, k], np.int64))}


def test_dense_and_compressed_of_one_name_dequantize(tmp_path):
    """A file with both P.weight (dense) and P.weight_packed: dequantize wrote 'P.weight' twice into one
    header before the fix."""
    rs = np.random.RandomState(5)
    _, _, ts = packed_module(rs, 4, 64)
    ts[UP + ".weight"] = ("BF16", rs.standard_normal((4, 64)).astype(np.float32))
    src = tmp_path / "m"
    write_model(src, ts, ct_config("pack-quantized", 4, 32))
    out = tmp_path / "out"
    refused(xquant("dequantize", src, "-o", out), str(out), f"'{UP}.weight'", "dense")
    outf = tmp_path / "out.safetensors"
    refused(xquant("dequantize", src / "model.safetensors", "-o", outf), str(outf), f"'{UP}.weight'")


def test_dense_and_compressed_of_one_name_in_two_shards(tmp_path):
    """The compressed module in one shard, a dense P.weight in the other: two files and one index entry."""
    rs = np.random.RandomState(6)
    _, _, ts = packed_module(rs, 4, 64)
    src = tmp_path / "m"
    write_model(src, ts, ct_config("pack-quantized", 4, 32))
    os.rename(src / "model.safetensors", src / "model-00001-of-00002.safetensors")
    save_official(src / "model-00002-of-00002.safetensors",
                  {UP + ".weight": ("BF16", np.ones((4, 64), np.float32))}, {"format": "pt"})
    wmap = {n: "model-00001-of-00002.safetensors" for n in ts}
    wmap[UP + ".weight"] = "model-00002-of-00002.safetensors"
    with open(src / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f)
    out = tmp_path / "out"
    refused(xquant("dequantize", src, "-o", out), str(out), f"'{UP}.weight'")


def test_dense_and_compressed_of_one_name_quantize(tmp_path):
    """The quantize direction: P.weight to compress and a P.weight_packed already there is refused."""
    rs = np.random.RandomState(7)
    ts = {UP + ".weight": ("F32", rs.standard_normal((8, 128)).astype(np.float32)),
          UP + ".weight_packed": ("I32", np.zeros((8, 16), np.int32))}
    src = tmp_path / "m"
    write_model(src, ts, {"model_type": "llama", "torch_dtype": "float32"})
    out = tmp_path / "out"
    refused(xquant("quantize", src, "-o", out), str(out), f"'{UP}.weight_packed' already exists")


# 17.4: GPTQ activation ordering.

@pytest.mark.parametrize("bits,dtype", [(4, None), (8, None), (4, "F32"), (4, "F16")])
def test_g_idx_is_applied(tmp_path, bits, dtype):
    """weight_g_idx[j] is the group of input column j (GPTQ with actorder "group", as compressed-tensors
    before 0.20 decompressed it: the columns sorted by group, each group with its scale). Before the fix
    the columns were dequantized in column order (group j // G) and weight_g_idx was copied into the
    dense output."""
    rs = np.random.RandomState(8 + bits)
    n, k, g = 6, 128, 32
    q, s, ts = packed_module(rs, n, k, bits=bits, group=g)
    g_idx = rs.permutation(np.repeat(np.arange(k // g), g)).astype(np.int32)
    assert (g_idx != np.arange(k) // g).any()
    ts[UP + ".weight_g_idx"] = ("I32", g_idx)
    ts["model.norm.weight"] = ("BF16", np.ones(8, np.float32))
    src = tmp_path / "m"
    write_model(src, ts, ct_config("pack-quantized", bits, g, actorder="group"))
    out = tmp_path / "out"
    r = xquant("dequantize", src, "-o", out, *(["--dtype", dtype] if dtype else []))
    assert r.returncode == 0, r.stderr
    _, o = read_official(out / "model.safetensors")
    assert sorted(o) == sorted(["model.norm.weight", UP + ".weight"])  # weight_g_idx is consumed
    s32 = bf16_bits_to_f32(f32_to_bf16_bits(s)).reshape(s.shape)  # the stored bfloat16 scales
    w32 = (q.astype(np.float32) * s32[:, g_idx]).astype(np.float32)
    dt, got = o[UP + ".weight"]
    assert dt == (dtype or "BF16")
    if dt == "BF16":
        want = bf16_bits_to_f32(f32_to_bf16_bits(w32)).reshape(w32.shape)
    elif dt == "F16":
        want = w32.astype(np.float16)
    else:
        want = w32
    np.testing.assert_array_equal(got, want)
    # the column-order reading (what the code did before) differs
    assert not np.array_equal(bf16_bits_to_f32(f32_to_bf16_bits(q * s32[:, np.arange(k) // g])).reshape(n, k),
                              bf16_bits_to_f32(f32_to_bf16_bits(w32)).reshape(n, k))


def test_g_idx_of_minus_one_is_column_order(tmp_path):
    """compressed-tensors initialises weight_g_idx to -1: no activation ordering, groups in column order."""
    rs = np.random.RandomState(12)
    n, k, g = 4, 64, 32
    q, s, ts = packed_module(rs, n, k, group=g)
    ts[UP + ".weight_g_idx"] = ("I32", np.full(k, -1, np.int32))
    src = tmp_path / "m"
    write_model(src, ts, ct_config("pack-quantized", 4, g))
    out = tmp_path / "out"
    r = xquant("dequantize", src, "-o", out)
    assert r.returncode == 0, r.stderr
    _, o = read_official(out / "model.safetensors")
    assert sorted(o) == [UP + ".weight"]  # weight_g_idx is a quantization parameter: not copied
    s32 = bf16_bits_to_f32(f32_to_bf16_bits(s)).reshape(s.shape)
    want = bf16_bits_to_f32(f32_to_bf16_bits(q * s32[:, np.arange(k) // g])).reshape(n, k)
    np.testing.assert_array_equal(o[UP + ".weight"][1], want)


@pytest.mark.parametrize("bad,needle", [(4, "group 4"), (-2, "group -2"), ("shape", "[64]"), ("dtype", "F32")])
def test_bad_g_idx_is_refused(tmp_path, bad, needle):
    rs = np.random.RandomState(13)
    n, k, g = 4, 128, 32
    _, _, ts = packed_module(rs, n, k, group=g)
    g_idx = (np.arange(k) // g).astype(np.int32)
    if bad == "shape":
        ts[UP + ".weight_g_idx"] = ("I32", g_idx[:64])
    elif bad == "dtype":
        ts[UP + ".weight_g_idx"] = ("F32", g_idx.astype(np.float32))
    else:
        g_idx[77] = bad
        ts[UP + ".weight_g_idx"] = ("I32", g_idx)
    src = tmp_path / "m"
    write_model(src, ts, ct_config("pack-quantized", 4, g, actorder="group"))
    out = tmp_path / "out"
    refused(xquant("dequantize", src, "-o", out), str(out), f"'{UP}.weight_g_idx'", needle)


# ---------------------------------------------------------------------------------------------------
# 17.5: a single row of 2^28 elements in bounded memory.

def _one_row_model(d, k):
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "torch_dtype": "float16"}, f)
    hdr = json.dumps({UP + ".weight": {"dtype": "F16", "shape": [1, k], "data_offsets": [0, k * 2]}})
    hdr += " " * (-(8 + len(hdr)) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hdr)) + hdr.encode())
        f.seek(8 + len(hdr) + k * 2 - 2)
        f.write(struct.pack("<e", 0.5))  # the last element: one nonzero value, the rest sparse zeros


def _peak_rss_mb(args):
    p = subprocess.Popen([XQ, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stdout.close()
    p.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, err
    return usage.ru_maxrss / 1024


@pytest.mark.parametrize("preset", ["W8A8", "W4A16"])
def test_one_huge_row_in_bounded_memory(tmp_path, preset):
    """[1, 2^28] float16 (512 MiB): one scale per row (W8A8: a group of 2^28 elements) or groups of 128
    in a row longer than a piece (W4A16). Before the fix a row was the unit of work: a 1 GiB float32
    copy of it, and a peak of 1.7 GB."""
    k = 1 << 28
    src = tmp_path / "m"
    _one_row_model(src, k)
    out = tmp_path / "out"
    peak = _peak_rss_mb(["quantize", src, "-o", out, "--preset", preset, "-q"])
    assert peak < 200, f"peak resident set {peak:.0f} MB"
    # the values: zeros and one 0.5 at the end
    with open(out / "model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        base = 8 + n
        sc = hdr[UP + ".weight_scale"]
        f.seek(base + sc["data_offsets"][0])
        scales = np.frombuffer(f.read(sc["data_offsets"][1] - sc["data_offsets"][0]), "<f2")
        qn = UP + (".weight" if preset == "W8A8" else ".weight_packed")
        qe = hdr[qn]["data_offsets"]
        f.seek(base + qe[1] - 4)
        last_word = np.frombuffer(f.read(4), "<u4")[0]
    # compressed-tensors' rule: s = amax / ((qmax - qmin) / 2), an all-zero group float16's epsilon 2^-10
    if preset == "W8A8":
        s = np.float16(np.float32(0.5) / np.float32(127.5))
        q = int(np.clip(np.rint(np.float32(0.5) / np.float32(s)), -128, 127))
        assert scales.shape == (1,) and scales[0] == s
        assert last_word == q << 24  # bytes 0, 0, 0, q
    else:
        s = np.float16(np.float32(0.5) / np.float32(7.5))
        q = int(np.clip(np.rint(np.float32(0.5) / np.float32(s)), -8, 7))
        assert scales.shape == (k // 128,) and (scales[:-1] == np.float16(2.0 ** -10)).all()
        assert scales[-1] == s
        assert last_word == ((q + 8) << 28) | 0x08888888  # q + 8 in the top nibble, 0 + 8 elsewhere


def _expected(x, bits, group, scale_dt):
    """Stored scales (widened) and integers of an [N, K] weight, recomputed in float32 NumPy with
    compressed-tensors' symmetric rule (s = amax / ((qmax - qmin) / 2), q = rint(clamp(x / s')))."""
    n, k = x.shape
    g = k if group == 0 else group
    xg = x.astype(np.float32).reshape(n, k // g, g)
    amax = np.where(np.isfinite(xg), np.abs(xg), np.float32(0)).max(axis=-1)
    s = (amax / np.float32(7.5 if bits == 4 else 127.5)).astype(np.float32)
    sw = bf16_bits_to_f32(f32_to_bf16_bits(s)).reshape(s.shape) if scale_dt == "BF16" else s.astype(np.float16).astype(np.float32)
    sw = np.where(sw == 0, np.float32(2.0 ** -7 if scale_dt == "BF16" else 2.0 ** -10), sw).astype(np.float32)
    lo, hi = (-8, 7) if bits == 4 else (-128, 127)
    q = np.clip(np.rint((xg / sw[..., None]).astype(np.float32)), lo, hi)
    return sw, q.astype(np.int32).reshape(n, k)


@pytest.mark.parametrize("preset,group", [("W8A8", None), ("W4A16", "0"), ("W4A16", "128"), ("W8A16", "0")])
def test_rows_longer_than_a_piece(tmp_path, preset, group):
    """K = 2^18 + 128: per channel, each row is a group longer than a piece (its scale from a first pass
    over its pieces); with groups of 128, pieces of whole groups run across rows. The stored values are
    those of the formula, and dequantize gives q * s' back."""
    rs = np.random.RandomState(21)
    k = (1 << 18) + 128
    x = (rs.standard_normal((3, k)) * 0.05).astype(np.float32)
    x[1, -1] = 0.9  # the largest value of row 1 in its last piece
    src = tmp_path / "m"
    write_model(src, {UP + ".weight": ("BF16", x)}, {"model_type": "llama", "torch_dtype": "bfloat16"})
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--preset", preset, *(["--group-size", group] if group else []), "-q")
    assert r.returncode == 0, r.stderr
    bits = 4 if preset == "W4A16" else 8
    xb = bf16_bits_to_f32(f32_to_bf16_bits(x)).reshape(x.shape)
    sw, q = _expected(xb, bits, int(group or 0), "BF16")
    _, o = read_official(out / "model.safetensors")
    np.testing.assert_array_equal(o[UP + ".weight_scale"][1], sw)
    if preset == "W8A8":
        np.testing.assert_array_equal(o[UP + ".weight"][1], q)
    else:
        words = o[UP + ".weight_packed"][1].astype(np.int64).astype(np.uint32)
        per = 32 // bits
        parts = (words[..., None] >> (bits * np.arange(per, dtype=np.uint32))) & ((1 << bits) - 1)
        np.testing.assert_array_equal(parts.reshape(3, -1).astype(np.int32) - (1 << (bits - 1)), q)
    dq = tmp_path / "dq"
    r = xquant("dequantize", out, "-o", dq, "--dtype", "F32", "-q")
    assert r.returncode == 0, r.stderr
    g = k if not group or group == "0" else int(group)
    want = (q.reshape(3, k // g, g) * sw[..., None]).astype(np.float32).reshape(3, k)
    np.testing.assert_array_equal(read_official(dq / "model.safetensors")[1][UP + ".weight"][1], want)


# ---------------------------------------------------------------------------------------------------
# 22.4: the outputs of the sample model and sample file, byte for byte those of the code before the
# rewrite on the library's kernels (hashes taken with the main branch's binary at 6251e2a).

SHA = {
    "W4A16/model.safetensors": "310bd2471a140811e058f7c38b5021265cc033be9ab8908aee658d987543e814",
    "W4A16/config.json": "a29f42ddd86fe3baa84fd62a35ba7f9fcc3946f210cd31a8326ed1767e47bfba",
    "W8A16/model.safetensors": "6348ececba5d3c30f3bc116ecc1f4a1426698a19c87f05e3e3397f18de51dfa7",
    "W8A16/config.json": "c8d887f4c3e852a8a1ff7f913d082f5e1a6b025c3d9aefb6a0142de9729323cb",
    "W8A8/model.safetensors": "c071c3a24811d323acb61a9c2625c509a3a90cd328d9d98624cd1a4fa67421e3",
    "W8A8/config.json": "dc67e1f8fb9ccc2ea705b9e3153b08d5858452148ef423ea3b999fa19a89c54c",
    "dq-W4A16/model.safetensors": "76d2bfceaa03c8b2d34490d6b9c2f2351b15161e6c87c8f6c4f0b421635c4db8",
    "dq-W8A16/model.safetensors": "00e00b29cca3dd4b9cb76438a00619eb478628dd4142fbdae04f285a491b7b91",
    "dq-W8A8/model.safetensors": "5bf24ae1a773d82436f6c6550d32dc84a859eba27c7d94996c80f86d2d5409fa",
    "g0/model.safetensors": "be71139186ba5586b418ff2bdccff617f5b6d9fe6ff3cdc357371506e1e94feb",
    "g32/model.safetensors": "caaf9486bf1ddebdecf54d2d7225b5de81ce7a46da94931e3a7a4355d3a4db19",
    "f8.safetensors": "6c1f21a81f983cdaff29c82a1f34988dc50346608c7accd5edbc9a77c6d7fa9a",
    "f4.safetensors": "eb2128915c57e3c21de405febca8a6579a73ca553d627d94756287dcea929dd7",
    "fa.safetensors": "606211a662c28a679ca15a75e33d676f2962d9267b4c3e95b9b44bf28df3ea3c",
    "df8.safetensors": "054a89dbcc64995b1b89d3dcf42da782a2af6baf847fbf56b91b6975d4dea7cb",
    "df4.safetensors": "37e9835fd61a8db5231ed38adaac5f0c6ad3c5c108c178e955345d663cecefd4",
    "dfa.safetensors": "626cf99af00e6843b41b20afa4922b822caed855560cddce559cc6b310ed5300",
    "fa4.safetensors": "040a735bc3d82788cc4be72de64db7905cd712d7e5d428f051edd585a1b24b21",
    "dfa4.safetensors": "bcbb585ba9ff2cf491364ef5f1dc965695715a4c8892879e43e490def3a01d3d",
}
# The report's numbers of the same runs (--report), also unchanged: total SQNR and max error.
REPORT = {"W4A16": (13.783664011967023, 0.046875), "W8A16": (38.91919623076131, 0.0025634765625),
          "W8A8": (37.03541174300612, 0.0025634765625)}


# Issue 19 made compressed-tensors' scale rule the default: the sample model's directory outputs under the
# default rule are below (SHA_CT, REPORT_CT: taken with this branch's binary; their numbers are checked
# independently by test_cli_export.py's NumPy recomputation and compressed-tensors' own functions), and
# --scale-rule amax-qmax still writes the bytes above, unchanged.
SHA_CT = {
    "W4A16/model.safetensors": "abeaf4f001575da6744bb0971b9b47da120dac9cab44900e06940a334199166b",
    "W4A16/config.json": "a29f42ddd86fe3baa84fd62a35ba7f9fcc3946f210cd31a8326ed1767e47bfba",
    "W8A16/model.safetensors": "be0c02e2ed1735d27450e33b7acbf75fb6df3108b4506eb2531adc6ef71dc238",
    "W8A16/config.json": "c8d887f4c3e852a8a1ff7f913d082f5e1a6b025c3d9aefb6a0142de9729323cb",
    "W8A8/model.safetensors": "671f760dca5445543681b5bf52790eda1d939549423ecec4112fd73603df1de9",
    "W8A8/config.json": "dc67e1f8fb9ccc2ea705b9e3153b08d5858452148ef423ea3b999fa19a89c54c",
    "dq-W4A16/model.safetensors": "865a99c3a8e49180b408b7b0a8f27314a75898eb82eb0215c37f002a8c912521",
    "dq-W8A16/model.safetensors": "df1e24509b5cd03401a479cd4aedc892c1018e8cb353330deee467c4e62a2667",
    "dq-W8A8/model.safetensors": "53e41cc48ac8aa268bc5631a7414cab3974ce527173c4933964603970f1c77d2",
    "g0/model.safetensors": "45c8962aeb2aab5e41db63f030db15e0e54b091004d0802e26980439a332c7f2",
    "g32/model.safetensors": "0c388421606e53245aaa287b48fadd859db27ba7cb1b74e59f69fa0b030ae4e0",
    "W4A16_ASYM/model.safetensors": "50b8ed24fc7c921da8be3bb75f6a547cc4fb89b8fdff1bb9cfbd74fd692b0852",
    "W4A16_ASYM/config.json": "e9af49ada24d830214538eb74e947741771feca98eb7abb380de9cef12db16bb",
    "dq-W4A16_ASYM/model.safetensors": "b642cabfcdd7c77db6fa29fd139df125b53aad389458bdef4e364b2ea15095aa",
}
# W4A16: +0.49 dB over the amax / qmax rule (the full int4 range); W8A16 / W8A8 within +-0.01 dB.
REPORT_CT = {"W4A16": (14.276793346618366, 0.043212890625), "W8A16": (38.913404545726046, 0.0025634765625),
             "W8A8": (37.04312451114036, 0.0025634765625), "W4A16_ASYM": (17.398782292751925, 0.0245361328125)}


@pytest.mark.parametrize("threads", ["1", "2"])
def test_outputs_are_unchanged(tmp_path, threads):
    t = ["--threads", threads, "-q"]
    runs = []
    for rule, pre in (("amax-qmax", ""), ("compressed-tensors", "ct-")):
        r = ["--scale-rule", rule]
        for p in ("W4A16", "W8A16", "W8A8"):
            runs.append(["quantize", SAMPLE_MODEL, "-o", tmp_path / (pre + p), "--preset", p, *r,
                         "--report", tmp_path / f"{pre}{p}.json", *t])
            runs.append(["dequantize", tmp_path / (pre + p), "-o", tmp_path / f"{pre}dq-{p}", *t])
        for g in ("0", "32"):
            runs.append(["quantize", SAMPLE_MODEL, "-o", tmp_path / f"{pre}g{g}", "--group-size", g, *r, *t])
    runs.append(["quantize", SAMPLE_MODEL, "-o", tmp_path / "ct-W4A16_ASYM", "--preset", "w4a16_asym",
                 "--report", tmp_path / "ct-W4A16_ASYM.json", *t])
    runs.append(["dequantize", tmp_path / "ct-W4A16_ASYM", "-o", tmp_path / "ct-dq-W4A16_ASYM", *t])
    runs += [["quantize", SAMPLE_FILE, "-o", tmp_path / "f8.safetensors", *t],
             ["quantize", SAMPLE_FILE, "-o", tmp_path / "f4.safetensors", "--bits", "4", *t],
             ["quantize", SAMPLE_FILE, "-o", tmp_path / "fa.safetensors", "--asymmetric", *t],
             ["dequantize", tmp_path / "f8.safetensors", "-o", tmp_path / "df8.safetensors", *t],
             ["dequantize", tmp_path / "f4.safetensors", "-o", tmp_path / "df4.safetensors", *t],
             ["dequantize", tmp_path / "fa.safetensors", "-o", tmp_path / "dfa.safetensors", *t],
             ["quantize", SAMPLE_FILE, "-o", tmp_path / "fa4.safetensors", "--bits", "4", "--asymmetric", *t],
             ["dequantize", tmp_path / "fa4.safetensors", "-o", tmp_path / "dfa4.safetensors", "--dtype", "F32", *t]]
    for args in runs:
        r = xquant(*args)
        assert r.returncode == 0, (args, r.stderr)
    got = {rel: hashlib.sha256((tmp_path / rel).read_bytes()).hexdigest() for rel in SHA}
    assert got == SHA
    got = {rel: hashlib.sha256((tmp_path / ("ct-" + rel)).read_bytes()).hexdigest() for rel in SHA_CT}
    assert got == SHA_CT
    for pre, rep in (("", REPORT), ("ct-", REPORT_CT)):
        for p, (sqnr, mx) in rep.items():
            j = json.loads((tmp_path / f"{pre}{p}.json").read_text())
            assert (j["totals"]["sqnr_db"], j["totals"]["max_abs_error"]) == (sqnr, mx), (pre, p)
