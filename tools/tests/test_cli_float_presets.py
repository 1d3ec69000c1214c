"""The float presets FP8_DYNAMIC and NVFP4A16 (issue 19 item 3), end to end through the built binary.

Independent side: the compressed-tensors package's own functions (calculate_qparams, generate_gparam,
its float-quantized and nvfp4-pack-quantized compressors and decompressors), transformers
(AutoModelForCausalLM / AutoModel on the CPU) and the official safetensors reader. Every stored tensor
is compared bit for bit with what compressed-tensors computes from the same float32 weights
(docs/cli.md, "FP8_DYNAMIC and NVFP4A16"). These tests need torch, transformers and compressed-tensors:
when one is missing they fail in CI (CI=true) and are skipped with the reason otherwise.
"""
import json
import os

import pytest

from xquant_cli_support import ROOT, bf16_bits_to_f32, f32_to_bf16_bits, np, xquant
from test_cli_export import HF_MISSING, build_model, config_of, forward, write_model

SAMPLE_MODEL = os.path.join(ROOT, "data", "sample-model")

if HF_MISSING is None:  # test_cli_export checked torch, transformers and compressed-tensors (CI: failing)
    import torch
    import transformers
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
    from safetensors.torch import load_file

pytestmark = pytest.mark.skipif(HF_MISSING is not None, reason=HF_MISSING or "")

FORMAT = {"FP8_DYNAMIC": "float-quantized", "NVFP4A16": "nvfp4-pack-quantized"}
UP_PROJ = "model.layers.0.mlp.up_proj"
# Cosine similarity of the flattened logits (BERT: last hidden state) to the float model's: the floor
# each preset must reach on the tiny random models (measured values in docs/cli.md).
COS_FLOOR = {"FP8_DYNAMIC": 0.99, "NVFP4A16": 0.95}
TORCH_DT = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def scheme_of(preset):
    return preset_name_to_scheme(preset, ["Linear"])


def ct_reference(x32, preset, scale_dtype):
    """compressed-tensors' own functions on the float32 weight x32 [N, K] (a torch tensor): the stored
    tensors it computes, as {name suffix: tensor}.

    FP8_DYNAMIC: calculate_qparams per row (float32), the scale stored in the model's dtype (a stored 0
    becomes that dtype's epsilon: what compressed-tensors computes when it runs on a model of that dtype,
    and what xquant stores; for float32 both are the same), the float-quantized compressor with the
    stored scale. NVFP4A16: generate_gparam of the tensor, calculate_qparams per group of 16 with it
    (FP8 E4M3 scales, 0 -> 0.125), the nvfp4-pack-quantized compressor."""
    scheme = scheme_of(preset)
    comp = BaseCompressor.get_value_from_registry(FORMAT[preset])
    n, k = x32.shape
    if preset == "FP8_DYNAMIC":
        lo, hi = x32.amin(-1, keepdim=True), x32.amax(-1, keepdim=True)
        scale, _ = calculate_qparams(lo, hi, scheme.weights)
        zero = ((lo == 0) & (hi == 0)) | (scale.to(scale_dtype) == 0)
        scale = torch.where(zero, torch.tensor(torch.finfo(scale_dtype).eps, dtype=scale_dtype), scale.to(scale_dtype))
        out = comp.compress({"weight": x32, "weight_scale": scale.float()}, scheme)
        return {"weight": out["weight"], "weight_scale": scale}
    gs = generate_gparam(x32.amin(), x32.amax())
    xg = x32.reshape(n, k // 16, 16)
    scale, _ = calculate_qparams(xg.amin(-1), xg.amax(-1), scheme.weights, global_scale=gs)
    out = comp.compress({"weight": x32, "weight_scale": scale, "weight_global_scale": gs}, scheme)
    return {"weight_packed": out["weight_packed"], "weight_scale": out["weight_scale"], "weight_global_scale": gs}


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def stored(out_dir):
    sd = {}
    for fn in sorted(os.listdir(out_dir)):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(out_dir, fn)))
    return sd


def check_against_ct(src_sd, out_sd, preset, scale_dtype, modules):
    """Every tensor of every quantized module equals compressed-tensors' own result bit for bit; the
    module's float weight is gone; nothing else is stored for it."""
    for mod in modules:
        x = src_sd[mod + ".weight"].float()
        want = ct_reference(x, preset, scale_dtype)
        got = {k[len(mod) + 1:]: v for k, v in out_sd.items() if k.startswith(mod + ".weight")}
        assert set(got) == set(want), (mod, sorted(got))
        for key, w in want.items():
            assert same_bits(got[key], w), (mod, key, got[key].dtype, w.dtype)


def check_config(out_dir, src_dir, preset):
    cfg, scfg = config_of(out_dir), config_of(src_dir)
    qc = cfg.pop("quantization_config")
    assert cfg == scfg
    assert qc["format"] == FORMAT[preset] and qc["quant_method"] == "compressed-tensors"
    # the config group is compressed-tensors' preset as it serializes it, field for field
    (grp,) = qc["config_groups"].values()
    want = json.loads(scheme_of(preset).model_dump_json())
    assert grp["targets"] == ["Linear"]
    for key in ("weights", "input_activations", "output_activations"):
        assert grp[key] == want[key], key
    QuantizationConfig.model_validate(qc)
    return qc


# ---------------------------------------------------------------------------------------------------
# The bytes, against compressed-tensors' functions.

def special_weight(n, k, seed):
    rs = np.random.RandomState(seed)
    x = (rs.standard_normal((n, k)) * 0.05).astype(np.float32)
    x[0] = 0                        # an all-zero row (FP8: scale epsilon; NVFP4: every group 0.125)
    x[1] = np.abs(x[1]) + 0.01      # positive only
    x[2] = -np.abs(x[2]) - 0.01     # negative only
    x[3, :16] = 0
    x[3, 5] = 1e-30                 # a group whose scale underflows E4M3: 0.125
    x[4, :16] = -0.0                # -0.0 -> FP4 +0 (torch.sign(-0.0) is 0), FP8 0x80
    x[4, 16:32] = np.float32(-1e-6)  # in a group of amax 1: rounds to zero, keeps the sign (FP4 -0, code 8)
    x[4, 31] = 1.0
    x[5, 3] = 3.0                   # the tensor's largest value: NVFP4's global scale
    # FP8 ties: row 7 has amax 0.875, so s = 0.875 / 448 = 2^-9 exactly and x / s = t for these t: the
    # ties between E4M3 neighbours (to the even code), subnormal ones, and 460 (clamped to 448)
    ties8 = [1.0625, 1.1875, 2.125, 2.375, 15.5, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 0.0]
    x[7] = 0
    x[7, 0] = 0.875
    for i, t in enumerate(ties8):
        x[7, 1 + i] = t * 2.0 ** -9
        x[7, 20 + i] = -t * 2.0 ** -9
    return x


def nvfp4_ties(x):
    """Row 6, group 1 (float32 weights): values whose float32 quotient by the group's effective scale is
    exactly an FP4 tie (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5), found by search around t * s_eff with
    compressed-tensors' own scale; the group's amax is 1.0 (x[6, 31]), the tensor's stays 3.0."""
    args = scheme_of("NVFP4A16").weights
    gs = generate_gparam(torch.tensor(float(x.min())), torch.tensor(float(x.max())))
    scale, _ = calculate_qparams(torch.tensor([0.0]), torch.tensor([1.0]), args, global_scale=gs)
    se = (scale / gs).numpy().astype(np.float32)[0]
    x[6, 16:32] = 0
    x[6, 31] = 1.0
    for i, t in enumerate([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]):
        up = down = np.float32(t) * se
        cands = [up]
        for _ in range(8):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            cands += [up, down]
        hit = [v for v in cands if v / se == np.float32(t)]
        assert hit, t
        x[6, 16 + 2 * i] = hit[0]
        x[6, 17 + 2 * i] = -hit[0]
    return x


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "NVFP4A16"])
@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_bit_for_bit_with_compressed_tensors(tmp_path, preset, dtype):
    """Float32 weights: exactly compressed-tensors' arithmetic. bfloat16 / float16 weights: the same
    functions run on the weights widened to float32 (xquant computes in float32 throughout)."""
    x = special_weight(24, 256, 19)
    if dtype == "F32":
        x = nvfp4_ties(x)
    elif dtype == "BF16":
        x = bf16_bits_to_f32(f32_to_bf16_bits(x)).reshape(x.shape)
    elif dtype == "F16":
        x = x.astype(np.float16).astype(np.float32)
    src = tmp_path / "m"
    write_model(src, {UP_PROJ + ".weight": (dtype, x)}, config={"model_type": "llama", "torch_dtype": TORCH_DT[dtype]})
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--preset", preset.lower(), "-q")
    assert r.returncode == 0, r.stderr
    sd = stored(out)
    sdt = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype]
    check_against_ct({UP_PROJ + ".weight": torch.from_numpy(x)}, sd, preset, sdt, [UP_PROJ])
    check_config(out, src, preset)
    if preset == "NVFP4A16":
        assert sd[UP_PROJ + ".weight_scale"][0].view(torch.uint8).eq(0x20).all()  # the zero row: 0.125
        assert sd[UP_PROJ + ".weight_packed"][4, :8].eq(0).all()  # -0.0 -> +0
        assert sd[UP_PROJ + ".weight_packed"][4, 8:15].eq(0x88).all()  # -1e-6 -> -0
        if dtype == "F32":  # the ties of row 6: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
            assert sd[UP_PROJ + ".weight_packed"][6, 8:15].tolist() == [0x80, 0xA2, 0xA2, 0xC4, 0xC4, 0xE6, 0xE6]
    else:
        assert sd[UP_PROJ + ".weight"][4, :16].view(torch.uint8).eq(0x80).all()
        # the ties of row 7: to the even code (1.0625 -> 1, 1.1875 -> 1.25, 2.125 -> 2, 2.375 -> 2.5, 15.5 -> 16,
        # subnormals 2^-10 -> 0, 3 * 2^-10 -> 2^-8, 5 * 2^-10 -> 2^-8), 0 -> 0
        want = [0x38, 0x3A, 0x40, 0x42, 0x58, 0x00, 0x02, 0x02, 0x00]
        assert sd[UP_PROJ + ".weight"][7, 1:10].view(torch.uint8).tolist() == want
        assert sd[UP_PROJ + ".weight"][7, 20:29].view(torch.uint8).tolist() == [b | 0x80 for b in want]


@pytest.mark.parametrize("preset,shape", [("FP8_DYNAMIC", (3, 300_000)), ("NVFP4A16", (64, 8192))])
def test_long_rows_and_several_pieces(tmp_path, preset, shape):
    """FP8 rows longer than a piece of 2^18 elements (the scale from a first pass over the pieces);
    NVFP4 tensors of several pieces (the global scale from a first pass over them)."""
    rs = np.random.RandomState(5)
    x = (rs.standard_normal(shape) * 0.02).astype(np.float32)
    x[1, -1] = 0.5  # the row's (and tensor's) largest value in its last piece
    src = tmp_path / "m"
    write_model(src, {UP_PROJ + ".weight": ("F32", x)}, config={"model_type": "llama", "torch_dtype": "float32"})
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--preset", preset, "-q", "--threads", "2")
    assert r.returncode == 0, r.stderr
    check_against_ct({UP_PROJ + ".weight": torch.from_numpy(x)}, stored(out), preset, torch.float32, [UP_PROJ])


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "NVFP4A16"])
def test_nan_and_inf_weights_are_refused(tmp_path, preset):
    x = np.full((8, 64), 0.25, np.float32)
    x[3, 17] = np.nan
    src = tmp_path / "m"
    write_model(src, {UP_PROJ + ".weight": ("F32", x)}, config={"model_type": "llama", "torch_dtype": "float32"})
    out = tmp_path / "out"
    r = xquant("quantize", src, "-o", out, "--preset", preset)
    assert r.returncode == 1
    assert (f"tensor '{UP_PROJ}.weight': row 3, column 17: NaN: {preset} refuses NaN and +-Inf weights"
            in r.stderr), r.stderr
    assert not out.exists() and os.listdir(tmp_path) == ["m"]
    x[3, 17] = -np.inf
    write_model(src, {UP_PROJ + ".weight": ("F32", x)}, config={"model_type": "llama", "torch_dtype": "float32"})
    r = xquant("quantize", src, "-o", out, "--preset", preset)
    assert r.returncode == 1 and "row 3, column 17: -Inf" in r.stderr, r.stderr


def test_nvfp4_all_zero_tensor(tmp_path):
    """generate_gparam of an all-zero tensor: 2688 / FLT_MIN overflows, replaced by 1; every group's scale
    is 0, replaced by 0.125; every code 0."""
    x = np.zeros((4, 32), np.float32)
    src = tmp_path / "m"
    write_model(src, {UP_PROJ + ".weight": ("F32", x)}, config={"model_type": "llama", "torch_dtype": "float32"})
    out = tmp_path / "out"
    assert xquant("quantize", src, "-o", out, "--preset", "NVFP4A16", "-q").returncode == 0
    sd = stored(out)
    assert sd[UP_PROJ + ".weight_global_scale"].tolist() == [1.0]
    assert sd[UP_PROJ + ".weight_scale"].view(torch.uint8).eq(0x20).all()
    assert sd[UP_PROJ + ".weight_packed"].eq(0).all()
    check_against_ct({UP_PROJ + ".weight": torch.from_numpy(x)}, sd, "NVFP4A16", torch.float32, [UP_PROJ])


def test_bf16_cpu_path_of_compressed_tensors_differs(tmp_path):
    """What docs/cli.md says about compressed-tensors run on bfloat16 tensors directly (its CPU path, as
    llm-compressor runs it without a GPU): it rounds amax / 448 (FP8) and amax / 6 and 2688 / amax
    (NVFP4) to bfloat16 and, for FP8, divides x / s in bfloat16, so its bytes differ from the float32
    arithmetic that xquant implements. Counted on the sample model's weights; the test fails if they
    stop differing (then xquant's rule for bfloat16 should be revisited)."""
    sd = load_file(os.path.join(SAMPLE_MODEL, "model.safetensors"))
    mods = sorted(n[:-7] for n, t in sd.items() if n.endswith("proj.weight") and t.ndim == 2)
    diff = {"FP8_DYNAMIC": 0, "NVFP4A16": 0}
    total = {"FP8_DYNAMIC": 0, "NVFP4A16": 0}
    for preset in diff:
        for mod in mods:
            x = sd[mod + ".weight"]
            ours = ct_reference(x.float(), preset, torch.bfloat16)
            scheme = scheme_of(preset)
            comp = BaseCompressor.get_value_from_registry(FORMAT[preset])
            if preset == "FP8_DYNAMIC":
                s, _ = calculate_qparams(x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), scheme.weights)
                theirs = comp.compress({"weight": x, "weight_scale": s}, scheme)["weight"]
                a, b = ours["weight"], theirs
            else:
                gs = generate_gparam(x.amin(), x.amax())
                xg = x.reshape(x.shape[0], -1, 16)
                s, _ = calculate_qparams(xg.amin(-1), xg.amax(-1), scheme.weights, global_scale=gs)
                theirs = comp.compress({"weight": x, "weight_scale": s, "weight_global_scale": gs}, scheme)
                a, b = ours["weight_packed"], theirs["weight_packed"]
            diff[preset] += int((a.view(torch.uint8) != b.view(torch.uint8)).sum())
            total[preset] += a.numel()
    print(f"compressed-tensors on bfloat16 tensors vs float32 arithmetic: differing stored bytes {diff} of {total}")
    assert diff["FP8_DYNAMIC"] > 0 and diff["NVFP4A16"] > 0


# ---------------------------------------------------------------------------------------------------
# Loading with transformers, decompression, dequantize, inspect, recipes.

ARCHS = ["llama", "qwen2-tied", "mistral-f16", "bert-f32"]


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "NVFP4A16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads(tmp_path, arch, preset):
    from transformers import CompressedTensorsConfig
    src, out, back = tmp_path / "float", tmp_path / "q", tmp_path / "back"
    fm, cls = build_model(arch, src)
    r = xquant("quantize", src, "-o", out, "--preset", preset, "-q")
    assert r.returncode == 0, r.stderr
    qc = check_config(out, src, preset)
    src_sd, out_sd = stored(src), stored(out)
    quantized = {k[: -len(".weight_scale")] for k in out_sd if k.endswith(".weight_scale")}
    assert quantized and not quantized & set(qc["ignore"])
    sdt = next(iter(src_sd.values())).dtype
    check_against_ct(src_sd, out_sd, preset, sdt, sorted(quantized))
    # every other tensor unchanged
    for k, v in src_sd.items():
        if k[: -len(".weight")] not in quantized:
            assert same_bits(out_sd[k], v), k

    assert xquant("dequantize", out, "-o", back).returncode == 0
    deq = stored(back)
    scheme = next(iter(QuantizationConfig.model_validate(qc).config_groups.values()))
    comp = BaseCompressor.get_value_from_registry(FORMAT[preset])
    for mod in quantized:
        ref = deq[mod + ".weight"]
        assert ref.dtype == sdt, (mod, ref.dtype)
        parts = {k[len(mod) + 1:]: v for k, v in out_sd.items() if k.startswith(mod + ".weight")}
        w = comp.decompress(parts, scheme)["weight"].to(ref.dtype)
        assert same_bits(w, ref), mod  # compressed-tensors' own decompressor

    # transformers, decompressing on load: every quantized module equals xquant dequantize bit for bit
    dm = cls.from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True))
    for mod in quantized:
        w = dm.get_submodule(mod).weight.detach()
        assert same_bits(w, deq[mod + ".weight"]), (mod, w.dtype)
    # transformers as it loads by default (compressed modules): the quantized set and the outputs
    qm = cls.from_pretrained(out)
    loaded = {n for n, m in qm.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    assert loaded == quantized
    x = forward(fm, arch)
    models = {"decompressed": dm, "compressed modules": qm}
    if preset == "NVFP4A16" and sdt != torch.bfloat16:
        # Upstream (transformers 5.24, compressed-tensors 0.20.1): a compressed NVFP4 module decompresses its
        # weight to bfloat16 whatever the model's dtype, and its forward then fails on float16 / float32
        # activations. The decompressed model (dequantize=True) runs. Fails once upstream fixes it.
        with pytest.raises(RuntimeError, match="dtype"):
            forward(qm, arch)
        del models["compressed modules"]
    cos = {k: torch.nn.functional.cosine_similarity(x.flatten(), forward(m, arch).flatten(), dim=0).item()
           for k, m in models.items()}
    print(f"{arch} {preset}: cosine similarity " + ", ".join(f"{v:.5f} ({k})" for k, v in cos.items()))
    assert min(cos.values()) > COS_FLOOR[preset], cos


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "NVFP4A16"])
def test_dequantize_file_and_inspect(tmp_path, preset):
    out, back, one = tmp_path / "q", tmp_path / "back", tmp_path / "one.safetensors"
    assert xquant("quantize", SAMPLE_MODEL, "-o", out, "--preset", preset, "-q").returncode == 0
    assert xquant("dequantize", out, "-o", back).returncode == 0
    # a single file, its format read from its tensors: the same bytes as the directory's (bfloat16 model)
    r = xquant("dequantize", out / "model.safetensors", "-o", one)
    assert r.returncode == 0, r.stderr
    assert one.read_bytes() == (back / "model.safetensors").read_bytes()
    r = xquant("inspect", out)
    assert r.returncode == 0, r.stderr
    want = ("compressed-tensors float-quantized: FP8 E4M3 weights, symmetric, per output channel, FP8 dynamic "
            "per-token activations" if preset == "FP8_DYNAMIC" else
            "compressed-tensors nvfp4-pack-quantized: FP4 E2M1 weights (FP8 E4M3 scales, a float32 global scale), "
            "symmetric, groups of 16")
    assert want in r.stdout, r.stdout
    assert "quantized modules: 14" in r.stdout
    r = xquant("inspect", out, "--json")
    j = json.loads(r.stdout)
    roles = {t["name"]: t for t in j["files"][0]["tensors"]}
    q = roles[UP_PROJ + (".weight" if preset == "FP8_DYNAMIC" else ".weight_packed")]
    assert q["role"] == "quantized" and q["original_shape"] == [512, 256]
    assert q["dtype"] == ("F8_E4M3" if preset == "FP8_DYNAMIC" else "U8")
    assert roles[UP_PROJ + ".weight_scale"]["role"] == "scale"
    if preset == "NVFP4A16":
        assert roles[UP_PROJ + ".weight_global_scale"]["role"] == "global_scale"


@pytest.mark.parametrize("preset,text", [
    ("FP8_DYNAMIC", "default_stage:\n  default_modifiers:\n    QuantizationModifier:\n"
                    "      targets: [Linear]\n      ignore: [lm_head]\n      scheme: fp8_dynamic\n"),
    ("FP8_DYNAMIC", "QuantizationModifier:\n  ignore: [lm_head]\n  config_groups:\n    group_0:\n"
                    "      targets: [Linear]\n"
                    "      weights: {num_bits: 8, type: float, strategy: channel, symmetric: true, dynamic: false}\n"
                    "      input_activations: {num_bits: 8, type: float, strategy: token, symmetric: true,"
                    " dynamic: true}\n"),
    ("NVFP4A16", "QuantizationModifier:\n  ignore: [lm_head]\n  scheme: NVFP4A16\n"),
    ("NVFP4A16", "QuantizationModifier:\n  ignore: [lm_head]\n  config_groups:\n    group_0:\n"
                 "      targets: [Linear]\n"
                 "      weights: {num_bits: 4, type: float, strategy: tensor_group, group_size: 16, symmetric: true,"
                 " dynamic: false, scale_dtype: torch.float8_e4m3fn}\n"),
])
def test_recipe(tmp_path, preset, text):
    """A recipe naming the preset (or spelling out its config group) gives the --preset output's weights."""
    rec = tmp_path / "recipe.yaml"
    rec.write_text(text)
    a, b = tmp_path / "a", tmp_path / "b"
    r = xquant("quantize", SAMPLE_MODEL, "-o", a, "--recipe", rec, "-q")
    assert r.returncode == 0, r.stderr
    assert xquant("quantize", SAMPLE_MODEL, "-o", b, "--preset", preset, "-q").returncode == 0
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert config_of(a)["quantization_config"]["format"] == FORMAT[preset]


@pytest.mark.parametrize("args,needle", [
    (["--preset", "NVFP4A16", "--group-size", "32"], "--group-size: NVFP4A16 has groups of 16"),
    (["--preset", "FP8_DYNAMIC", "--group-size", "128"], "--group-size: FP8_DYNAMIC has one scale per output channel"),
    (["--preset", "FP8_DYNAMIC", "--scale-rule", "amax-qmax"], "--scale-rule amax-qmax is a rule of the int presets"),
    (["--preset", "NVFP4A16", "--observer", "mse"], "--observer mse searches int ranges"),
    (["--preset", "FP8"], "--preset: unknown preset 'FP8', expected W4A16, W4A16_ASYM, W8A16, W8A8, FP8_DYNAMIC or "
                          "NVFP4A16"),
])
def test_bad_options(tmp_path, args, needle):
    r = xquant("quantize", SAMPLE_MODEL, "-o", tmp_path / "out", *args)
    assert r.returncode == 1 and needle in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_nvfp4_k_not_multiple_of_16(tmp_path):
    rs = np.random.RandomState(3)
    ts = {"model.layers.0.mlp.down_proj.weight": ("BF16", rs.standard_normal((16, 40)).astype(np.float32)),
          UP_PROJ + ".weight": ("BF16", rs.standard_normal((40, 32)).astype(np.float32))}
    src = tmp_path / "m"
    write_model(src, ts, config={"model_type": "llama", "torch_dtype": "bfloat16"})
    r = xquant("quantize", src, "-o", tmp_path / "out", "--preset", "NVFP4A16")
    assert r.returncode == 1 and "NVFP4A16's groups of 16 do not divide" in r.stderr, r.stderr
    r = xquant("quantize", src, "-o", tmp_path / "out", "--preset", "NVFP4A16", "--keep-partial-dense", "-q")
    assert r.returncode == 0, r.stderr
    assert config_of(tmp_path / "out")["quantization_config"]["ignore"] == ["model.layers.0.mlp.down_proj"]


def test_dequantize_refuses_bad_float_tensors(tmp_path):
    """dequantize checks the float formats' tensors: a global scale that is not finite and positive, a
    weight_global_scale or an FP8 weight of another dtype (exit 1, naming the tensor, nothing written)."""
    from safetensors.torch import save_file
    q8, q4 = tmp_path / "q8", tmp_path / "q4"
    assert xquant("quantize", SAMPLE_MODEL, "-o", q8, "--preset", "FP8_DYNAMIC", "-q").returncode == 0
    assert xquant("quantize", SAMPLE_MODEL, "-o", q4, "--preset", "NVFP4A16", "-q").returncode == 0
    cases = [
        (q4, UP_PROJ + ".weight_global_scale", torch.tensor([0.0]), "expected a finite positive global scale"),
        (q4, UP_PROJ + ".weight_global_scale", torch.tensor([float("inf")]), "expected a finite positive global scale"),
        (q4, UP_PROJ + ".weight_global_scale", torch.tensor([1.0], dtype=torch.float16), "expected F32 [1]"),
        (q8, UP_PROJ + ".weight", torch.zeros((512, 256), dtype=torch.int8), "must be a 2-D F8_E4M3 tensor"),
    ]
    for i, (src, name, value, needle) in enumerate(cases):
        d = tmp_path / f"bad{i}"
        os.makedirs(d)
        for fn in os.listdir(src):
            if not fn.startswith("."):
                with open(src / fn, "rb") as a, open(d / fn, "wb") as b:
                    b.write(a.read())
        sd = stored(d)
        sd[name] = value
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        r = xquant("dequantize", d, "-o", tmp_path / f"out{i}")
        assert r.returncode == 1 and name in r.stderr and needle in r.stderr, (needle, r.stderr)
        assert not (tmp_path / f"out{i}").exists()
