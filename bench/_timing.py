"""Timing helper shared by the Python benchmarks (bench/compare.py, bench/bench_matmul.py)."""

from __future__ import annotations

import statistics
import time


def median_times(fns, reps):
    """Median seconds of each function; the calls are interleaved (one of each per round) so that the
    machine's bandwidth drifting during the run affects all of them alike."""
    for f in fns:  # warm-up (allocator, page faults, compilation)
        f()
        f()
    ts = [[] for _ in fns]
    for _ in range(reps):
        for k, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]
