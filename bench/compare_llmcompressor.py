#!/usr/bin/env python3
"""`xquant quantize` against llm-compressor's data-free `oneshot` on the same model and preset.

For each preset, two subprocesses quantize the same Hugging Face model directory:

* llm-compressor: this script in a child mode, which loads the model with transformers, runs
  `oneshot(model, recipe=QuantizationModifier(targets="Linear", scheme=PRESET, ignore=["lm_head"]))`
  (no calibration data: the data-free pipeline) and `save_pretrained(OUT, save_compressed=True)`;
* xquant: `xquant quantize MODEL -o OUT --preset PRESET --threads N`.

Reported per preset: wall time of each subprocess (for llm-compressor also the part spent loading,
quantizing and saving, without the Python / torch imports), peak RSS of each subprocess (GNU time's `%M`),
the fraction of stored values that are equal between the two outputs per tensor kind (`weight_packed` /
`weight`: the 4-bit or 8-bit codes, compared field by field in the stored bytes; `weight_scale`,
`weight_zero_point`, `weight_global_scale`: element by element), and the weight SQNR in dB of each
output against the original weights (all quantized Linear weights together: sum of w^2 over sum of
(w - dequantized)^2), both dequantized by compressed-tensors' own decompressors.

llm-compressor is not a dependency of xquant and this script is not run in CI. Without it the script
says how to install it and exits 0. The numbers in docs/performance.md came from (llm-compressor in a
separate directory so that the environment's torch / transformers / compressed-tensors stay as they are):

    python -m pip install --target /tmp/llmc-pkgs --no-deps llmcompressor datasets accelerate \\
        pyarrow 'dill<0.4.2' pandas xxhash 'multiprocess<0.70.20' requests urllib3 certifi \\
        charset-normalizer python-dateutil six pytz tzdata
    PYTHONPATH=/tmp/llmc-pkgs python bench/compare_llmcompressor.py                    # data/sample-model
    PYTHONPATH=/tmp/llmc-pkgs python bench/compare_llmcompressor.py --synthetic 1024:4  # a larger synthetic Llama
    PYTHONPATH=/tmp/llmc-pkgs python bench/compare_llmcompressor.py --model PATH/TO/HF-MODEL-DIR

llmcompressor 0.14.0.1 (the newest on 2026-12-02) pins compressed-tensors 0.19.0 and transformers <= 5.17;
no release accepts compressed-tensors 0.20.1 and transformers 5.24, with which it was run here (`--no-deps`)
without a problem in the data-free path.

`--synthetic HIDDEN:LAYERS` writes a Llama made by scripts/make_sample_model.py's generator (same weight
statistics: per-channel magnitudes, two outlier input features, bfloat16) at another size: HIDDEN / 128
attention heads of 128 (half as many key/value heads), MLP 2.75 x HIDDEN rounded to a multiple of 128,
vocabulary 8192. It is a synthetic model, not a trained one.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ["W4A16", "W4A16_ASYM", "W8A16", "W8A8", "FP8_DYNAMIC", "NVFP4A16"]
# Width in bits of one stored code of the quantized weight (and the packed zero point).
CODE_BITS = {"W4A16": 4, "W4A16_ASYM": 4, "W8A16": 8, "W8A8": 8, "FP8_DYNAMIC": 8, "NVFP4A16": 4}
KINDS = ["weight_packed", "weight", "weight_scale", "weight_zero_point", "weight_global_scale"]

INSTALL_HINT = """llm-compressor is not importable, so there is nothing to compare against (this script is not
run in CI). Install it into a separate directory, without letting pip replace torch, transformers or
compressed-tensors, and put that directory on PYTHONPATH:

    python -m pip install --target /tmp/llmc-pkgs --no-deps llmcompressor datasets accelerate \\
        pyarrow 'dill<0.4.2' pandas xxhash 'multiprocess<0.70.20' requests urllib3 certifi \\
        charset-normalizer python-dateutil six pytz tzdata
    PYTHONPATH=/tmp/llmc-pkgs python bench/compare_llmcompressor.py

(or `pip install llmcompressor` in an environment of its own, with versions of torch, transformers and
compressed-tensors that it accepts)."""


# ---------------------------------------------------------------------------------------------------
# Child: llm-compressor in its own process.

def llmc_child(src, out, preset, threads):
    t0 = time.perf_counter()
    import torch
    torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=preset, ignore=["lm_head"]))
    model.save_pretrained(out, save_compressed=True)
    t2 = time.perf_counter()
    print("LLMC_RESULT " + json.dumps({"import_s": t1 - t0, "work_s": t2 - t1}))


# ---------------------------------------------------------------------------------------------------
# Parent.

TIME = "/usr/bin/time"  # GNU time (Debian package `time`)


def run_measured(cmd, env):
    """Runs cmd; returns (wall seconds, peak RSS of cmd in MiB or None, stdout, stderr).

    The peak RSS is GNU time's `%M` (the ru_maxrss of its child). It is not taken from this process's own
    rusage of the child: a process forked from this one and then exec'ed keeps, in its ru_maxrss, the
    resident size it had before exec (this process's, with a generated model in memory), while GNU time's
    child starts from time's few pages. Without /usr/bin/time the RSS is not reported."""
    use_time = os.access(TIME, os.X_OK)
    fd, rss_file = tempfile.mkstemp(prefix="xquant-rss-")
    os.close(fd)
    full = [TIME, "-f", "%M", "-o", rss_file, *cmd] if use_time else cmd
    try:
        t0 = time.perf_counter()
        p = subprocess.Popen(full, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = p.communicate()
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{err[-4000:]}")
        rss = None
        if use_time:
            with open(rss_file) as f:
                rss = int(f.read().split()[-1]) / 1024.0
        return wall, rss, out, err
    finally:
        os.unlink(rss_file)


def load_dir(d):
    from safetensors.torch import load_file
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, fn)))
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return sd, cfg


def fields(t, bits):
    """The stored bytes of t, split into `bits`-wide fields (4: two nibbles a byte; 8: bytes)."""
    import torch
    b = t.contiguous().view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
    if bits == 4:
        return torch.stack([b & 0xF, b >> 4], dim=-1).reshape(-1)
    return b


def elements(t):
    """One row of raw bytes per element (so that -0.0 != 0.0 and NaN == NaN compare as stored)."""
    import torch
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).reshape(t.numel(), t.element_size())


def compare(src, a_dir, b_dir, preset):
    """Equal fractions per kind between outputs a (llm-compressor) and b (xquant); SQNR of each."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig

    orig, _ = load_dir(src)
    res = {"equal": {}, "sqnr_db": {}, "notes": []}
    outs = {}
    for tag, d in (("llmc", a_dir), ("xquant", b_dir)):
        sd, cfg = load_dir(d)
        qcfg = QuantizationConfig.model_validate(cfg["quantization_config"])
        (scheme,) = qcfg.config_groups.values()
        mods = sorted(k[: -len(".weight_scale")] for k in sd if k.endswith(".weight_scale"))
        outs[tag] = (sd, qcfg.format, scheme, mods)
    (sa, _, _, ma), (sb, _, _, mb) = outs["llmc"], outs["xquant"]
    if ma != mb:
        res["notes"].append(f"quantized modules differ: only llm-compressor {sorted(set(ma) - set(mb))}, "
                            f"only xquant {sorted(set(mb) - set(ma))}")
    if set(sa) != set(sb):
        res["notes"].append(f"tensor names differ: {sorted(set(sa) ^ set(sb))[:6]}")
    mods = sorted(set(ma) & set(mb))
    bits = CODE_BITS.get(preset, 8)
    for kind in KINDS:
        eq = tot = 0
        for m in mods:
            ka = sa.get(f"{m}.{kind}")
            kb = sb.get(f"{m}.{kind}")
            if ka is None or kb is None:
                continue
            if ka.shape != kb.shape or ka.dtype != kb.dtype:
                res["notes"].append(f"{m}.{kind}: {ka.dtype} {list(ka.shape)} against {kb.dtype} {list(kb.shape)}")
                continue
            if kind in ("weight_packed", "weight") or (kind == "weight_zero_point" and ka.dtype == torch.int32):
                fa, fb = fields(ka, bits), fields(kb, bits)
                eq += int((fa == fb).sum())
                tot += fa.numel()
            else:
                fa, fb = elements(ka), elements(kb)
                eq += int((fa == fb).all(dim=1).sum())
                tot += fa.shape[0]
        if tot:
            res["equal"][kind] = eq / tot
    # Other tensors (embeddings, norms, lm_head) should be the input's, bit for bit, in both.
    for tag, (sd, _, _, qm) in outs.items():
        qset = set(qm)
        for k, v in orig.items():
            if k.rsplit(".", 1)[0] in qset:
                continue
            if k not in sd or not torch.equal(elements(sd[k]), elements(v)):
                res["notes"].append(f"{tag}: {k} is not the input's tensor")
    for tag, (sd, fmt, scheme, qm) in outs.items():
        comp = BaseCompressor.get_value_from_registry(fmt)
        sig = noise = 0.0
        for m in qm:
            parts = {k[len(m) + 1:]: v for k, v in sd.items() if k.startswith(m + ".weight")}
            w = comp.decompress(parts, scheme)["weight"].double()
            ref = orig[m + ".weight"].double()
            sig += float((ref * ref).sum())
            noise += float(((ref - w) ** 2).sum())
        res["sqnr_db"][tag] = 10 * math.log10(sig / noise) if noise else float("inf")
    return res


def make_synthetic(spec, out_dir):
    """A Llama of HIDDEN:LAYERS from scripts/make_sample_model.py's generator, resized."""
    hidden, layers = (int(x) for x in spec.split(":"))
    if hidden % 128:
        sys.exit("--synthetic: HIDDEN must be a multiple of 128")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_sample_model as msm
    heads = hidden // 128
    kv = max(1, heads // 2)
    ffn = (hidden * 11 // 4 + 127) // 128 * 128
    msm.VOCAB, msm.HIDDEN, msm.HEADS, msm.KV_HEADS, msm.FFN, msm.LAYERS = 8192, hidden, heads, kv, ffn, layers
    msm.HEAD_DIM = 128
    msm.CONFIG = dict(msm.CONFIG, vocab_size=8192, hidden_size=hidden, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=ffn, num_hidden_layers=layers, head_dim=128)
    msm.write(out_dir)
    return f"synthetic Llama hidden {hidden}, {layers} layers, {heads} heads ({kv} kv), MLP {ffn}, vocab 8192"


def fmt_mib(x):
    return "n/a" if x is None else f"{x:.0f}"


def fmt_s(x):
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "sample-model"),
                    help="Hugging Face model directory (default: data/sample-model)")
    ap.add_argument("--synthetic", metavar="HIDDEN:LAYERS", default=None,
                    help="instead of --model, generate a synthetic Llama of this size (e.g. 1024:4)")
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated (default: all six)")
    ap.add_argument("--xquant", default=None,
                    help="the xquant executable (default: build/release/tools/xquant, else xquant on PATH)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all cores)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and preset; each time and peak RSS is the minimum over them")
    ap.add_argument("--workdir", default=None, help="keep the outputs here (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="also write the results as JSON")
    ap.add_argument("--llmc-child", nargs=3, metavar=("SRC", "OUT", "PRESET"), help=argparse.SUPPRESS)
    ap.add_argument("--compare-child", nargs=4, metavar=("SRC", "A", "B", "PRESET"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.llmc_child:
        src, out, preset = args.llmc_child
        llmc_child(src, out, preset, args.threads)
        return 0
    if args.compare_child:
        import torch
        torch.set_num_threads(args.threads)
        print("COMPARE_RESULT " + json.dumps(compare(*args.compare_child)))
        return 0

    missing = [m for m in ("llmcompressor", "torch", "transformers", "compressed_tensors", "safetensors")
               if importlib.util.find_spec(m) is None]
    if "llmcompressor" in missing:
        print(INSTALL_HINT)
        return 0
    if missing:
        print(f"compare_llmcompressor.py also needs {', '.join(missing)}; nothing compared.")
        return 0
    xq = args.xquant or os.path.join(ROOT, "build", "release", "tools", "xquant")
    if not os.path.isfile(xq):
        xq = shutil.which("xquant")
        if not xq:
            sys.exit("no xquant executable: build it (scripts/build) or pass --xquant PATH")
    from importlib.metadata import version

    work = args.workdir or tempfile.mkdtemp(prefix="xquant-vs-llmc-")
    os.makedirs(work, exist_ok=True)
    try:
        model, desc = args.model, None
        if args.synthetic:
            model = os.path.join(work, "synthetic-" + args.synthetic.replace(":", "x"))
            desc = make_synthetic(args.synthetic, model)
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
        rows, results = [], []
        for preset in args.presets.split(","):
            a, b = os.path.join(work, f"llmc-{preset}"), os.path.join(work, f"xquant-{preset}")
            best = {}
            for _ in range(args.repeat):
                for d in (a, b):
                    shutil.rmtree(d, ignore_errors=True)
                wall, rss, out, _ = run_measured(
                    [sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                     "--llmc-child", model, a, preset], env)
                work_s = json.loads(out.rsplit("LLMC_RESULT ", 1)[1])["work_s"]
                xwall, xrss, _, _ = run_measured(
                    [xq, "quantize", model, "-o", b, "--preset", preset, "--threads", str(args.threads), "-q"], env)
                for k, v in (("llmc_wall_s", wall), ("llmc_work_s", work_s), ("xquant_wall_s", xwall),
                             ("llmc_rss_mib", rss), ("xquant_rss_mib", xrss)):
                    best[k] = v if best.get(k) is None or v is None else min(best[k], v)
            # The comparison runs in a child too: this process stays small (no torch), because a child
            # forked from it starts with its resident pages, and its peak RSS would count them.
            _, _, out, _ = run_measured([sys.executable, os.path.abspath(__file__), "--threads", str(args.threads),
                                         "--compare-child", model, a, b, preset], env)
            cmp = json.loads(out.rsplit("COMPARE_RESULT ", 1)[1])
            r = dict(preset=preset, **best, **cmp)
            results.append(r)
            eq = ", ".join(f"{k} {100 * v:.2f} %" for k, v in cmp["equal"].items())
            rows.append(f"| {preset} | {fmt_s(best['llmc_wall_s'])} ({fmt_s(best['llmc_work_s'])}) | "
                        f"{fmt_s(best['xquant_wall_s'])} | {fmt_mib(best['llmc_rss_mib'])} | {fmt_mib(best['xquant_rss_mib'])} | "
                        f"{eq} | {cmp['sqnr_db']['llmc']:.2f} | {cmp['sqnr_db']['xquant']:.2f} |")
            for n in cmp["notes"]:
                print(f"note ({preset}): {n}", file=sys.stderr)
        print(f"model: {model}" + (f" ({desc})" if desc else ""))
        print(f"llmcompressor {version('llmcompressor')}, compressed-tensors {version('compressed-tensors')}, "
              f"transformers {version('transformers')}, torch {version('torch')}; xquant {xq}; "
              f"{args.threads} threads; fastest of {args.repeat}")
        print()
        print("| preset | llm-compressor s (load+quantize+save) | xquant s | llm-compressor MiB | xquant MiB "
              "| equal stored values (per kind) | SQNR dB llm-compressor | SQNR dB xquant |")
        print("|---|---:|---:|---:|---:|---|---:|---:|")
        print("\n".join(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": model, "description": desc, "threads": args.threads, "repeat": args.repeat,
                           "llmcompressor": version("llmcompressor"), "results": results}, f, indent=2)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
