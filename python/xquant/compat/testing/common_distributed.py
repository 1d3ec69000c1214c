"""``torch_npu.testing.common_distributed`` of the xquant.compat stand-in: the multi-device skip."""

from __future__ import annotations

import functools
import unittest

import torch


def skipIfUnsupportMultiNPU(npu_number_needed: int):
    """Skips the test unless at least ``npu_number_needed`` NPUs are there (the stand-in has one)."""

    def decorate(test):
        @functools.wraps(test)
        def run(self, *args, **kwargs):
            npu = getattr(torch, "npu", None)
            have = npu.device_count() if npu is not None and npu.is_available() else 0
            if have < npu_number_needed:
                raise unittest.SkipTest(f"needs {npu_number_needed} NPUs, this machine has {have} "
                                        "(the xquant.compat stand-in has one)")
            return test(self, *args, **kwargs)

        return run

    return decorate
