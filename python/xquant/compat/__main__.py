"""python -m xquant.compat [--device DEV] SCRIPT [ARGS...] | -m MODULE [ARGS...]

Runs SCRIPT (or MODULE) as ``__main__`` with the xquant stand-in for torch_npu / mx_driving installed, as
``python SCRIPT ARGS...`` would: sys.argv is [SCRIPT, ARGS...], sys.path[0] is the script's directory.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = ("usage: python -m xquant.compat [--device DEV] SCRIPT [ARGS...]\n"
         "       python -m xquant.compat [--device DEV] -m MODULE [ARGS...]\n"
         "Runs Ascend code (import torch_npu, mx_driving, device='npu') with xquant's stand-in; 'npu' is DEV "
         "(default cpu).")


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    device = "cpu"
    while args and args[0].startswith("-") and args[0] != "-m":
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(USAGE)
            return 0
        if a == "--device":
            if not args:
                print("xquant.compat: --device needs a value\n" + USAGE, file=sys.stderr)
                return 2
            device = args.pop(0)
        elif a.startswith("--device="):
            device = a.split("=", 1)[1]
        elif a == "--":
            break
        else:
            print(f"xquant.compat: unknown option {a!r}\n" + USAGE, file=sys.stderr)
            return 2
    if not args or (args[0] == "-m" and len(args) < 2):
        print(USAGE, file=sys.stderr)
        return 2

    from . import install

    try:
        install(device)
    except (RuntimeError, ValueError) as e:
        print(f"xquant.compat: {e}", file=sys.stderr)
        return 1
    if args[0] == "-m":
        module = args[1]
        sys.argv = [module] + args[2:]  # runpy sets argv[0] to the module's file
        sys.path.insert(0, os.getcwd())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    script = args[0]
    if not os.path.exists(script):
        print(f"xquant.compat: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    sys.argv = args
    sys.path[0:1] = [os.path.dirname(os.path.abspath(script))]
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
