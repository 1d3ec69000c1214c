#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_ops (fuzz/corpus/ops/seed-*): one small input per operator form, dtype
and a few argument variants, encoded the way fuzz/fuzz_ops.cpp decodes its input (see the decoders
there: one byte per choice, 0 = the valid default; then one layout byte per tensor; then the data pool).

    fuzz/make_ops_corpus.py                  # rewrite the seeds (deterministic: same bytes every run)
    fuzz/make_ops_corpus.py --check BINARY   # also run them through a built fuzz_ops and report
                                             # how many decode to a successful call

The seeds only need to be good starting points; the fuzzer mutates them. fuzz/corpus/ops/regressions/
holds inputs that once crashed (never rewritten by this script).
"""
import argparse
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "ops")

F32, F16, BF16 = 0, 1, 2  # float_dtype() byte values
SIZES = [0, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 2, 3, 4, 8, 12, 24, 48, 100, 127, 128, 129, 255, 256,
         257, 1000, 1023, 1024, 1025, 2047, 2048, 4097]  # dim(): bytes 192 + index


def dim(d):
    if 1 <= d <= 8:
        return d - 1
    return 192 + SIZES.index(d)


def shape(*dims):
    return [len(dims)] + [dim(d) for d in dims]


def num_bits(n, lo):
    return n - lo


def data(rng, n_floats):
    """Random float32 values with the edge cases (ties, signed zeros, subnormals, Inf, NaN) mixed in."""
    edges = [0.5, 1.5, 2.5, -0.5, -2.5, 127.5, -128.5, 0.0, -0.0, 1e-40, -1e-45, 3.4e38, float("inf"),
             float("-inf"), float("nan"), 65504.0, 6.1e-5, 7.5, -8.5]
    vals = [rng.choice(edges) if rng.random() < 0.2 else rng.uniform(-4, 4) for _ in range(n_floats)]
    return b"".join(struct.pack("<f", v) for v in vals)


def seeds():
    rng = random.Random(20261201)
    s = {}
    shapes = {"s1": shape(7), "s2": shape(3, 5), "s3": shape(2, 3, 16), "s4": shape(2, 1, 4, 9)}
    # fake_tensor_quant_out (op 0) and its allocating form (op 24)
    for dt, dn in ((F32, "f32"), (F16, "f16"), (BF16, "bf16")):
        for sn, sh in shapes.items():
            args = [dt] + sh + [0, dt, 0, 0, num_bits(8, 1), 0, 0, 0]
            s[f"fq-{dn}-{sn}"] = bytes([0, 0] + args + [0, 0, 0]) + data(rng, 40)
    s["fq-alloc"] = bytes([24, 0, F32] + shape(4, 8) + [0, F32, 0, 0, num_bits(4, 1), 1] + [0, 0]) + data(rng, 40)
    s["fq-unsigned-wide"] = bytes([0, 0, F32] + shape(33) + [0, F16, 0, 0, num_bits(16, 1), 3, 0, 0, 0, 0, 0]) + data(rng, 40)
    s["fq-alias-out-is-in"] = bytes([0, 0, F32] + shape(3, 5) + [0, F32, 0, 0, 7, 0, 0, 0, 0, 0, 224]) + data(rng, 20)
    s["fq-bad-amax"] = bytes([0, 0, F32] + shape(3, 5) + [0, F32, 0, 250, 7, 0, 0, 0, 0, 0, 0]) + data(rng, 20)
    # fake_tensor_quant_with_axis_out (op 1) and fake_tensor_quant_inplace (op 33)
    for ax in (0, 1, 6, 7):  # axis bytes: 0, 1, -1, -2 (small_axis: 6.. = -1..)
        args = [F32] + shape(3, 4, 5) + [0, ax, F32, 0, 0, num_bits(8, 1), 0, 0, 0]
        s[f"fq-axis-{ax}"] = bytes([1, 0] + args + [0, 0, 0]) + data(rng, 70)
    s["fq-axis-bf16-last"] = bytes([1, 0, BF16] + shape(2, 65) + [0, 6, BF16, 0, 0, 7, 0, 0, 0, 0, 0, 0]) + data(rng, 70)
    s["fq-inplace"] = bytes([33, 0, F16] + shape(4, 9) + [0, F32, 0, 0, 7, 0, 0, 0]) + data(rng, 30)
    s["fq-inplace-f32"] = bytes([33, 0, F32] + shape(17) + [0, F32, 0, 0, 3, 2, 0, 0]) + data(rng, 30)
    # fake_tensor_quant_backward_out (op 2): form bit 0 = per-axis, bit 7 = no grad_amax
    s["fqb-tensor"] = bytes([2, 0, F32] + shape(4, 9) + [0, F32, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0] + [0] * 5) + data(rng, 60)
    s["fqb-axis"] = bytes([2, 0, F32] + shape(4, 9) + [1, 1, F32, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0] + [0] * 5) + data(rng, 60)
    s["fqb-axis0-f16"] = bytes([2, 0, F16] + shape(5, 3, 2) + [1, 0, F16, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0] + [0] * 5) + data(rng, 60)
    s["fqb-no-grad-amax"] = bytes([2, 0, BF16] + shape(31) + [0x80, F32, 0, 0, 7, 0, 0, 0, 0, 0] + [0] * 4) + data(rng, 60)
    s["fqb-alloc"] = bytes([26, 0, F32] + shape(3, 7) + [1, 6, F32, 0, 0, 7, 0, 0, 0] + [0] * 3) + data(rng, 60)
    # quantize_out (op 3): flags bit 0 = multiply mode, bit 1 = zero_points
    for q, qn in ((0, "qint8"), (1, "quint8"), (2, "qint32")):
        for sv in (0, 1):  # scales [1] / [channels]
            args = [F32] + shape(3, 8) + [q, 2, 1, F32, sv, 0, 3, 0, 0, 0]
            s[f"q-div-{qn}-{sv}"] = bytes([3, 0] + args + [0, 0, 0, 0]) + data(rng, 40)
    s["q-mul-int8"] = bytes([3, 0, F32] + shape(4, 16) + [0, 1, 1, F32, 1, 0, 0, 0, 0, 0] + [0] * 3) + data(rng, 80)
    s["q-mul-int4"] = bytes([3, 0, F16] + shape(4, 16) + [3, 3, 6, F32, 2, 0, 0, 0, 0, 0] + [0] * 4) + data(rng, 80)
    s["q-mul-int4-axis-2"] = bytes([3, 0, BF16] + shape(4, 16) + [3, 3, 7, F16, 1, 0, 0, 0, 0, 0] + [0] * 4) + data(rng, 80)
    s["q-alloc"] = bytes([27, 0, F32] + shape(2, 3, 4) + [0, 2, 1, F32, 1, 0, 4, 0] + [0] * 3) + data(rng, 40)
    # tile_quant (op 4): flags bit 0 = ASYM
    s["tile-sym"] = bytes([4, 0, 5, 9, 2, 0, 0, 0, 0, 0, 0, 3] + [0] * 3) + data(rng, 70)
    s["tile-asym"] = bytes([4, 0, 4, 17, 0, 1, 1, 0, 0, 0, 0, 1] + [0] * 4) + data(rng, 90)
    s["tile-alloc"] = bytes([28, 0, 3, 33, 1, 1, 0, 0, 0] + [0] * 3) + data(rng, 110)
    # dynamic_quant_asymmetric_out (op 5): flags bit 0 = int4, 1 = pertensor, 2 = smooth, 3 = group_index,
    # 4 = round the last dim up to a multiple of 8, 5 = int64 group_index
    for fl, fn in ((0, "tok"), (2, "tensor"), (17, "int4"), (4, "smooth"), (12, "groups"), (44, "groups64"),
                   (29, "groups-int4")):
        args = [F32, fl] + shape(6, 16) + [0, 0, 2, F32, 0] + ([] if fl & 32 else [0]) + [0] + [0] * 6
        s[f"dq-{fn}"] = bytes([5, 0] + args + [0] * 6) + data(rng, 100)
    s["dq-f16-rank3"] = bytes([5, 0, F16, 0] + shape(2, 3, 9) + [0, 0, 0, 0, 0, 0, 0] + [0] * 6 + [0] * 4) + data(rng, 60)
    s["dq-alloc"] = bytes([29, 0, BF16, 4] + shape(5, 8) + [0, 0, 0, BF16, 0, 0, 0] + [0] * 4) + data(rng, 60)
    # acts_ulq_out (op 6) / acts_ulq_backward_out (op 7): derive_broadcast bytes 0 = same shape,
    # 1 = [1], 9 = [], 2 + ones mask = some dims 1
    for dt, dn in ((F32, "f32"), (F16, "f16"), (BF16, "bf16")):
        args = [dt] + shape(2, 3, 4) + [0, 1, 1, 0, num_bits(8, 2), 0, 0] + [0] * 8
        s[f"ulq-{dn}"] = bytes([6, 0] + args + [0] * 7) + data(rng, 40)
    s["ulq-channel"] = bytes([6, 0, F32] + shape(2, 3, 4) + [0, 2, 0b101, 2, 0b101, 1, num_bits(4, 2), 0, 0]
                             + [0] * 8 + [0] * 7) + data(rng, 40)
    s["ulq-alloc"] = bytes([30, 0, F32] + shape(4, 5) + [0, 11, 2, 0b01, 0, 6, 0, 0] + [0] * 3) + data(rng, 40)
    s["ulqb-f32"] = bytes([7, 0, F32] + shape(2, 3, 4) + [0, 2, 0b101, 2, 0b101, 0, 6, 0, 0] + [0] * 8
                          + [0] * 6 + [0] * 9) + data(rng, 120)
    s["ulqb-scalar"] = bytes([7, 0, F16] + shape(5, 6) + [0, 1, 1, 0, 6, 0, 0] + [0] * 8 + [0] * 6 + [0] * 9) + data(rng, 120)
    s["ulqb-alloc"] = bytes([31, 0, BF16] + shape(3, 4) + [0, 2, 0b10, 2, 0b01, 1, 6, 0, 0] + [0] * 8 + [0] * 1
                            + [0] * 6) + data(rng, 60)
    # big cases (config bits 3-5 == 7): the cpu kernels split even their elementwise loops over threads
    s["big-fq"] = bytes([0, 0x38, F32] + shape(3) + [0, F32, 0, 0, 7, 0, 0, 0, 0, 0, 0]) + data(rng, 200)
    s["big-dq"] = bytes([5, 0x38, F16, 0] + shape(4, 16) + [0, 0, 0, 0, 0, 0, 0] + [0] * 6 + [0] * 3) + data(rng, 200)
    s["big-ulq"] = bytes([6, 0x38, F32] + shape(4) + [0, 0, 1, 1, 0, 6, 0, 0] + [0] * 8 + [0] * 7) + data(rng, 200)
    s["big-q"] = bytes([3, 0x3a, F32] + shape(2, 16) + [3, 1, 1, F32, 1, 0, 0, 0, 0, 0] + [0] * 3) + data(rng, 200)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", metavar="BINARY", help="run the seeds through a built fuzz_ops (verbose)")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        if name.startswith("seed-"):
            os.remove(os.path.join(OUT, name))
    all_seeds = seeds()
    for name, blob in sorted(all_seeds.items()):
        with open(os.path.join(OUT, f"seed-{name}"), "wb") as f:
            f.write(blob)
    print(f"wrote {len(all_seeds)} seeds to {os.path.relpath(OUT)}")
    if a.check:
        ok = 0
        for name in sorted(all_seeds):
            path = os.path.join(OUT, f"seed-{name}")
            env = dict(os.environ, XQUANT_FUZZ_VERBOSE="1")
            p = subprocess.run([a.check, path], env=env, capture_output=True, text=True)
            lines = [l for l in p.stderr.splitlines() if l.startswith("  -> ") or l.startswith("fuzz_ops: ")]
            result = next((l[5:] for l in lines if l.startswith("  -> ")), "?")
            head = next((l[10:] for l in lines if l.startswith("fuzz_ops: ")), "?")
            ok += result == "ok"
            print(f"{name:24s} rc={p.returncode} {head:60.60s} -> {result:.100s}")
            if p.returncode != 0:
                print(p.stderr[-3000:])
        print(f"{ok} of {len(all_seeds)} seeds decode to a successful call")


if __name__ == "__main__":
    sys.exit(main())
