#!/usr/bin/env python3
"""Throughput model of a compiled kernel's hot loop: llvm-mca on the loop as it runs.

Disassembles one function of an object file (objdump), walks the loop that contains a marker
instruction along the path the benchmark takes (conditional branches: backward taken, forward not
taken, unless --taken / --not-taken name their offsets), and runs llvm-mca for each CPU model on that
path. Prints the path and, per CPU, the block reciprocal throughput (cycles per iteration).

  bench/mca_loops.py build/release/CMakeFiles/xquant.dir/src/cpu/fake_quant.cpp.o \
      'N_AVX3::FwdSpan<(xquant::DType)0>' --marker vdivps --mcpu sapphirerapids,znver4

Needs binutils (objdump) and llvm-mca (Debian: llvm-19 has znver4 and sapphirerapids models).
"""
import argparse
import re
import subprocess
import sys

LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S.*)$")
BRANCH = re.compile(r"^(j[a-z]+)\s+([0-9a-f]+)\b")
# aarch64 (--arch aarch64): b, b.cond, cbz / cbnz REG, tbz / tbnz REG, #BIT, each with the target last.
BRANCH_A64 = re.compile(r"^(b|b\.[a-z]+|cbn?z|tbn?z)\s+(?:\S+,\s*)*([0-9a-f]+)$")
ARCH = {"branch": BRANCH, "jump": "jmp", "comment": "#", "call": ("ret", "call")}


def functions(obj, name, objdump):
    """Instruction lists of every function whose demangled name contains `name` (lambdas excluded)."""
    out = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", obj], check=True, capture_output=True,
                         text=True).stdout
    funcs, insns = [], None
    for line in out.splitlines():
        if line.endswith(">:"):
            insns = [] if name in line and "lambda" not in line else None
            if insns is not None:
                funcs.append(insns)
            continue
        m = LINE.match(line) if insns is not None else None
        if not m:
            continue
        text = m.group(2).split(ARCH["comment"])[0].split("<")[0].strip()
        if text.startswith("nop") or text.startswith("data16") or text.startswith("cs nop") or not text:
            continue
        insns.append((int(m.group(1), 16), text))
    if not funcs:
        sys.exit(f"no function matching {name!r} in {obj}")
    return funcs


def walk(insns, start, taken, not_taken, limit=4000):
    """Path from `start` until an address repeats; returns the cycle (list of (addr, text))."""
    index = {a: i for i, (a, _) in enumerate(insns)}
    if start not in index:
        return None
    i, seen, path = index[start], {}, []
    for _ in range(limit):
        a, t = insns[i]
        if a in seen:
            return path[seen[a]:]
        seen[a] = len(path)
        path.append((a, t))
        m = ARCH["branch"].match(t)
        if m:
            op, target = m.group(1), int(m.group(2), 16)
            if op == ARCH["jump"]:
                go = True
            elif a in taken:
                go = True
            elif a in not_taken:
                go = False
            else:
                go = target <= a
            if go:
                if target not in index:
                    return None  # leaves the function
                i = index[target]
                continue
        if t.split()[0] in ("ret", "call", "bl", "blr", "callq"):
            return None
        i += 1
        if i >= len(insns):
            return None
    return None


def all_loops(insns, marker, taken, not_taken):
    """Distinct loops (by their set of addresses) containing the marker, smallest first."""
    loops, seen = [], set()
    for a, t in insns:
        m = ARCH["branch"].match(t)
        if not m or int(m.group(2), 16) > a:
            continue
        loop = walk(insns, int(m.group(2), 16), taken, not_taken)
        ops = [x.split()[0] for _, x in loop] if loop else []
        want = [mk.split("*") for mk in marker.split(",") if not mk.startswith("!")]
        avoid = [mk[1:] for mk in marker.split(",") if mk.startswith("!")]
        if (loop and all(sum(o.startswith(w[0]) for o in ops) >= (int(w[1]) if len(w) > 1 else 1) for w in want)
                and not any(o.startswith(mk) for o in ops for mk in avoid)):
            key = frozenset(x for x, _ in loop)
            if key not in seen:
                seen.add(key)
                loops.append(loop)
    return sorted(loops, key=len)


def find_loop(insns, marker, start, taken, not_taken, pick=0):
    if start is not None:
        return walk(insns, start, taken, not_taken)
    loops = all_loops(insns, marker, taken, not_taken)
    return loops[pick] if pick < len(loops) else None


def mca(path, cpu, tool):
    def to_top(t):  # the loop's branches jump to its top
        m = ARCH["branch"].match(t)
        return t[:m.start(2)] + ".Ltop" + t[m.end(2):] if m else t
    body = [".Ltop:"] + [to_top(t) for _, t in path]
    res = subprocess.run([tool, f"-mcpu={cpu}", "-iterations=200"] + ARCH.get("mca_args", []),
                         input="\n".join(body) + "\n",
                         capture_output=True, text=True)
    if res.returncode != 0:
        return None, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "llvm-mca failed"
    m = re.search(r"Block RThroughput:\s+([0-9.]+)", res.stdout)
    c = re.search(r"Total Cycles:\s+([0-9]+)", res.stdout)
    return (float(m.group(1)), int(c.group(1)) / 200.0), res.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("obj")
    ap.add_argument("function", help="substring of the demangled function name")
    ap.add_argument("--marker", default="v", help="comma-separated mnemonic prefixes the loop must all contain (prefix*N: at least N times); "
                    "!prefix: must not contain")
    ap.add_argument("--start", help="hex offset where the loop path starts (default: found from --marker)")
    ap.add_argument("--taken", default="", help="comma-separated hex offsets of branches to take")
    ap.add_argument("--not-taken", default="", help="comma-separated hex offsets of branches not to take")
    ap.add_argument("--mcpu", default="sapphirerapids,znver4")
    ap.add_argument("--mca", default="llvm-mca-19")
    ap.add_argument("--objdump", default=None, help="default: objdump (x86-64), aarch64-linux-gnu-objdump (aarch64)")
    ap.add_argument("--arch", choices=["x86-64", "aarch64"], default="x86-64",
                    help="the object's architecture (aarch64: the cross build's objects, SVE2 enabled in llvm-mca)")
    ap.add_argument("--quiet", action="store_true", help="print only the figures")
    ap.add_argument("--list", action="store_true", help="list every loop containing the marker (start, size)")
    ap.add_argument("--pick", type=int, default=0, help="the n-th smallest such loop (default 0)")
    ap.add_argument("--full", action="store_true", help="print llvm-mca's whole report")
    ap.add_argument("--vectors", type=int, default=1, help="vectors per loop iteration (figures are divided by it)")
    a = ap.parse_args()
    if a.arch == "aarch64":
        ARCH.update(branch=BRANCH_A64, jump="b", comment="//",
                    mca_args=["-mtriple=aarch64-linux-gnu", "-mattr=+sve2"])
    a.objdump = a.objdump or ("aarch64-linux-gnu-objdump" if a.arch == "aarch64" else "objdump")
    hexes = lambda s: {int(x, 16) for x in s.split(",") if x}
    loop = None
    for insns in functions(a.obj, a.function, a.objdump):
        if a.list:
            for lp in all_loops(insns, a.marker, hexes(a.taken), hexes(a.not_taken)):
                r, _ = mca(lp, a.mcpu.split(",")[0], a.mca)
                print(f"start {lp[0][0]:x}: {len(lp)} instructions, {a.mcpu.split(',')[0]} {r[0] if r else '?'}: "
                      + " ".join(t.split()[0] for _, t in lp))
            continue
        loop = find_loop(insns, a.marker, int(a.start, 16) if a.start else None, hexes(a.taken), hexes(a.not_taken),
                         a.pick)
        if loop:
            break
    if a.list:
        return
    if not loop:
        sys.exit("no loop found")
    if not a.quiet:
        for addr, t in loop:
            print(f"  {addr:6x}: {t}")
    figures = []
    for cpu in a.mcpu.split(","):
        r, report = mca(loop, cpu, a.mca)
        if r is None:
            figures.append(f"{cpu}: {report}")
            continue
        v = a.vectors
        unit = "iteration" if v == 1 else "vector"
        figures.append(f"{cpu}: {r[0] / v:.2f} cycles/{unit} (block reciprocal throughput; simulated {r[1] / v:.2f})")
        if a.full:
            print(report)
    print(f"{len(loop)} instructions; " + "; ".join(figures))


if __name__ == "__main__":
    main()
