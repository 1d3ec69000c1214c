#!/usr/bin/env python3
"""Plots GB/s per operator against the memcpy bandwidth line from the JSON written by bench_ops
(Google Benchmark) and bench/compare.py.  Usage: plot.py bench_ops.json compare.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def median_rates(path):
    data = json.load(open(path))
    rates = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        name = b["run_name"].replace("/real_time", "")
        rates[name] = b["bytes_per_second"] / 1e9
    return rates


def main():
    ops, cmp_path, out = sys.argv[1:4]
    rates = median_rates(ops)
    probe = rates.pop("BM_memcpy_probe/100663296")
    big = {k: v for k, v in rates.items() if not any(s in k for s in ("/1024", "/4096", "/65536", "/1/1024", "/1/4096", "tile"))}
    cmp = json.load(open(cmp_path))
    fig, axes = plt.subplots(1, 2, figsize=(16, 7))
    ax = axes[0]
    names = list(big)
    ax.barh(names, [big[n] for n in names], color="tab:blue")
    ax.axvline(probe, color="tab:red", linestyle="--", label=f"memcpy probe {probe:.1f} GB/s")
    ax.axvline(0.9 * probe, color="tab:orange", linestyle=":", label="90 % of memcpy")
    ax.set_xlabel("GB/s (bytes read + written per call), median")
    ax.set_title("C++ out-variants, large shapes")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(loc="lower right")
    ax = axes[1]
    rows = [r for r in cmp["rows"]]
    labels = [r["case"] for r in rows]
    y = range(len(rows))
    ax.barh([i + 0.27 for i in y], [r["bytes"] / r["xquant_s"] / 1e9 for r in rows], height=0.27, label="xquant")
    ax.barh(list(y), [r["bytes"] / r["eager_s"] / 1e9 for r in rows], height=0.27, label="PyTorch eager")
    ax.barh([i - 0.27 for i in y], [r["bytes"] / r["compiled_s"] / 1e9 if r["compiled_s"] else 0 for r in rows],
            height=0.27, label="torch.compile")
    ax.axvline(cmp["memcpy_gbs"], color="tab:red", linestyle="--", label=f"memcpy probe {cmp['memcpy_gbs']:.1f} GB/s")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xlabel("GB/s (bytes read + written per call), median")
    ax.set_title(f"Python calls vs PyTorch ({cmp['threads']} threads)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
