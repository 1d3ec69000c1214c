#!/usr/bin/env python3
"""Plots GB/s per operator against the memcpy bandwidth measured in the same rounds.
Usage: plot.py ratios.json compare.json out.png   (from `bench_ops --ratios` and bench/compare.py)"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ratios_path, cmp_path, out = sys.argv[1:4]
    ratios = json.load(open(ratios_path))
    cmp = json.load(open(cmp_path))
    fig, axes = plt.subplots(1, 2, figsize=(17, 7.5))

    ax = axes[0]
    rows = ratios["rows"]
    y = list(range(len(rows)))
    ax.barh(y, [r["gbs"] for r in rows], color="tab:blue", label="xquant out-variant")
    ax.scatter([r["memcpy_gbs"] for r in rows], y, color="tab:red", marker="|", s=400, label="memcpy probe (same rounds)")
    ax.scatter([0.9 * r["memcpy_gbs"] for r in rows], y, color="tab:orange", marker="|", s=200, label="90 % of memcpy")
    ax.set_yticks(y)
    ax.set_yticklabels([r["case"] for r in rows], fontsize=7)
    ax.set_xlabel("GB/s (bytes read + written per call), median of 15 interleaved rounds")
    ax.set_title(f"C++ out-variants vs memcpy ({ratios['threads']} threads, {ratios['simd_target']})")
    ax.legend(loc="lower right", fontsize=8)

    ax = axes[1]
    rows = cmp["rows"]
    y = list(range(len(rows)))
    ax.barh([i + 0.27 for i in y], [r["bytes"] / r["xquant_s"] / 1e9 for r in rows], height=0.27, label="xquant")
    ax.barh(y, [r["bytes"] / r["eager_s"] / 1e9 for r in rows], height=0.27, label="PyTorch eager")
    ax.barh([i - 0.27 for i in y], [r["bytes"] / r["compiled_s"] / 1e9 if r["compiled_s"] else 0 for r in rows],
            height=0.27, label="torch.compile (Inductor)")
    ax.scatter([r["memcpy_gbs"] for r in rows], y, color="tab:red", marker="|", s=300, label="memcpy probe (same rounds)")
    ax.set_yticks(y)
    ax.set_yticklabels([r["case"] for r in rows], fontsize=7)
    ax.set_xlabel("GB/s (bytes read + written per call), median")
    ax.set_title(f"Python calls (allocating) vs PyTorch, {cmp['threads']} threads, torch {cmp['torch']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
