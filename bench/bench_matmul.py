#!/usr/bin/env python3
"""The quantized matmuls: xquant against what PyTorch offers on the CPU, side by side in one run.

K = N = 4096 (a Llama-7B projection), decode (M = 1, 4, 16) and prefill (M = 2048) shapes:

- W8A8 (int8 activations x int8 weight stored [N, K], as vllm-ascend passes it; per-channel float32 scale,
  per-token scale, bfloat16 output): `xquant.npu.npu_quant_matmul` against `torch._int_mm` + the same
  epilogue in PyTorch (float(acc) * scale * pertoken_scale -> bfloat16).
- W8A16 / W4A16 (float16 activations x int8 / int4 weight [K, N], per-channel float16 scale and offset):
  `xquant.npu.npu_weight_quant_batchmatmul` against dequantize (torch_npu's formula in float16) +
  `torch.matmul`, both in float16 (decode only unless --fp16-prefill: PyTorch's float16 CPU matmul has
  no fast kernel on CPUs without AVX512-FP16 / AMX) and upcast to float32.
- W4A8 (int8 activations x int4 weight, k groups of 256: npu_quant_matmul's A8W4 mode), float16 output;
  `torch._int_mm` on the int8 shapes is printed for scale (PyTorch has no int4 x int8 grouped operator).

Each time is the median of --reps calls after two warm-up calls, the candidates of a case interleaved
call by call; torch and xquant get the same thread count (torch.set_num_threads, OMP_NUM_THREADS).
xquant's result is exact (docs/semantics.md section 9); PyTorch's W8A8 output is compared bit for bit
(it matches wherever its float32 epilogue rounds as xquant's does), the weight-only outputs by their
largest difference from xquant's (PyTorch's summation order is its own).

    python bench/bench_matmul.py --threads 2 [--reps 5] [--only w8a8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for xquant and torch")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per measurement (median)")
    ap.add_argument("--only", default=None, help="substring filter on case names (w8a8, w8a16, w4a16, w4a8, M=...)")
    ap.add_argument("--no-prefill", action="store_true", help="skip M = 2048")
    ap.add_argument("--fp16-prefill", action="store_true", help="also time PyTorch's float16 matmul at M >= 16")
    ap.add_argument("--int-mm-prefill", action="store_true", help="also time torch._int_mm at M = 2048")
    ap.add_argument("--json", default=None, help="write results here")
    return ap.parse_args()


ARGS = parse_args()
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)  # before xquant's OpenMP runtime starts

import torch  # noqa: E402

import xquant  # noqa: E402
from _timing import median_times  # noqa: E402  (bench/, the script's directory)
from xquant import npu  # noqa: E402

torch.set_num_threads(ARGS.threads)
if hasattr(xquant, "set_num_threads"):
    xquant.set_num_threads(ARGS.threads)

K = N = 4096
DECODE = (1, 4, 16)
PREFILL = 2048


def w8a8_case(m, gen):
    x1 = torch.randint(-128, 128, (m, K), dtype=torch.int8, generator=gen)
    w = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=gen)  # stored [N, K]
    scale = torch.rand(N, generator=gen) * 0.01
    pertoken = torch.rand(m, generator=gen) * 0.1
    x2 = w.t()  # the [K, N] view of the stored weight, as vllm-ascend passes it

    def xq():
        return npu.npu_quant_matmul(x1, x2, scale, pertoken_scale=pertoken, output_dtype=torch.bfloat16)

    def th():
        acc = torch._int_mm(x1, x2)
        return (acc.float() * scale * pertoken[:, None]).to(torch.bfloat16)

    cands = {"xquant": xq}
    if m < PREFILL or ARGS.int_mm_prefill:
        cands["torch._int_mm + epilogue"] = th
    return cands, 2.0 * m * K * N


def a8w4_case(m, gen, group=256):
    """int8 activations x int4 weight [K, N / 8], per-(k group, column) int64 scale, offset and per-token scale,
    float16 output (npu_quant_matmul's A8W4 mode, docs/semantics.md 9.3.1). PyTorch has no such operator: its
    int8 GEMM on the same shapes (one product, no int4 halves, no groups) is timed for scale; its output is
    not comparable."""
    x1 = torch.randint(-128, 128, (m, K), dtype=torch.int8, generator=gen)
    q = torch.randint(-8, 8, (K, N), dtype=torch.int32, generator=gen)
    x2 = npu.npu_convert_weight_to_int4pack(q)
    scale = npu.npu_trans_quant_param(torch.rand(K // group * N, generator=gen)).reshape(K // group, N)
    offset = torch.randn(N, generator=gen)
    pertoken = torch.rand(m, 1, generator=gen) * 0.01
    w8 = q.to(torch.int8)
    xpad = x1 if m > 16 else torch.cat([x1, x1.new_zeros(17 - m, K)])  # _int_mm needs M > 16

    def xq():
        return npu.npu_quant_matmul(x1, x2, scale, offset=offset, pertoken_scale=pertoken,
                                    output_dtype=torch.float16, group_sizes=[0, 0, group])

    def th():
        return torch._int_mm(xpad, w8)

    cands = {"xquant": xq}
    if m < PREFILL or ARGS.int_mm_prefill:
        cands["torch._int_mm (int8, no groups)"] = th
    return cands, 2.0 * m * K * N


def wqbmm_case(m, int4, gen):
    x = (torch.rand(m, K, generator=gen) * 2 - 1).half()
    lo, hi = (-8, 8) if int4 else (-128, 128)
    q = torch.randint(lo, hi, (K, N), dtype=torch.int32, generator=gen)
    scale = (torch.rand(N, generator=gen) * 0.01).half()
    offset = (torch.rand(N, generator=gen) * 8 - 4).half()
    weight = npu.npu_convert_weight_to_int4pack(q) if int4 else q.to(torch.int8)
    qh = q.half()

    def xq():
        return npu.npu_weight_quant_batchmatmul(x, weight, scale, antiquant_offset=offset)

    def th16():  # torch_npu's dequantization in float16, then the float16 matmul
        return torch.matmul(x, (qh + offset) * scale)

    def th32():  # the same dequantization, the matmul in float32
        return torch.matmul(x.float(), ((qh + offset) * scale).float()).half()

    cands = {"xquant": xq, "dequant + torch.matmul fp32": th32}
    if m <= 4 or ARGS.fp16_prefill:
        cands["dequant + torch.matmul fp16"] = th16
    return cands, 2.0 * m * K * N


def main():
    gen = torch.Generator().manual_seed(0)
    ms = list(DECODE) + ([] if ARGS.no_prefill else [PREFILL])
    cases = []
    for m in ms:
        cases.append((f"w8a8 M={m}", lambda m=m: w8a8_case(m, gen)))
        cases.append((f"w8a16 M={m}", lambda m=m: wqbmm_case(m, False, gen)))
        cases.append((f"w4a16 M={m}", lambda m=m: wqbmm_case(m, True, gen)))
        cases.append((f"w4a8 M={m}", lambda m=m: a8w4_case(m, gen)))
    print(f"# {platform.processor() or platform.machine()}, {ARGS.threads} threads, torch {torch.__version__}, "
          f"K = N = {K}, median of {ARGS.reps}")
    print(f"{'case':<14} {'candidate':<30} {'ms':>10} {'GOPS':>8} {'vs xquant':>9}  check")
    results = []
    for name, make in cases:
        if ARGS.only and ARGS.only not in name:
            continue
        cands, ops = make()
        reps = ARGS.reps if not name.endswith(f"M={PREFILL}") else max(1, min(ARGS.reps, 3))
        names = list(cands)
        times = median_times([cands[n] for n in names], reps)
        ref = cands["xquant"]()
        for n, t in zip(names, times):
            check = ""
            if n != "xquant":
                out = cands[n]()
                if name.startswith("w4a8"):
                    check = "not comparable"
                elif name.startswith("w8a8"):
                    same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
                    check = "bit-identical" if same else "differs"
                else:
                    check = f"max |diff| {(out.float() - ref.float()).abs().max().item():.3g}"
            ratio = t / times[0]
            print(f"{name:<14} {n:<30} {t * 1e3:10.2f} {ops / t / 1e9:8.1f} {ratio:8.2f}x  {check}")
            results.append({"case": name, "candidate": n, "ms": t * 1e3, "gops": ops / t / 1e9, "check": check})
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"threads": ARGS.threads, "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
