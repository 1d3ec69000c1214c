"""``torch_npu.testing.common_utils`` of the xquant.compat stand-in: device selection, the
``SupportedDevices`` skip and the paired host / 'npu' input tensors of torch_npu's tests."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import unittest
from typing import Iterable, List

import numpy as np
import torch

IS_WINDOWS = sys.platform == "win32"


def _npu():
    npu = getattr(torch, "npu", None)
    if npu is None:
        raise RuntimeError("torch_npu.testing (xquant.compat stand-in): torch.npu is missing; "
                           "xquant.compat.install() first")
    return npu


def get_npu_device() -> str:
    """'npu:N' with N from $SET_NPU_DEVICE (default 'npu:0')."""
    index = os.environ.get("SET_NPU_DEVICE")
    return "npu:0" if index is None else f"npu:{index}"


def set_npu_device() -> str:
    """Makes get_npu_device() the current device and returns it."""
    device = get_npu_device()
    _npu().set_device(device)
    return device


def device_family(name: str) -> str:
    """The model family that SupportedDevices lists: 'Ascend910B4' -> 'Ascend910B', 'Ascend310P3' ->
    'Ascend310P', 'Ascend910_9392' -> 'Ascend910_93', 'Ascend950PR_9579' -> 'Ascend950'."""
    if name.startswith("Ascend950"):
        return name[:9]
    if name.startswith("Ascend910_"):
        return name[:12]
    return name[:10]


class SupportedDevices:
    """Decorator: runs the test only on the listed NPU families (else skips it, naming the device)."""

    def __init__(self, supported_devices: List[str]) -> None:
        self.supported_devices = list(supported_devices)

    def __call__(self, test):
        @functools.wraps(test)
        def run(slf, *args, **kwargs):
            family = device_family(_npu().get_device_name(0))
            if family not in self.supported_devices:
                raise unittest.SkipTest(f"runs only on {self.supported_devices}; this device is {family} "
                                        "(xquant.compat: set XQUANT_NPU_DEVICE to report another model)")
            return test(slf, *args, **kwargs)

        return run


def _paired(host: np.ndarray, npu_format: int, device) -> tuple:
    # The NPU tensor is a copy: an in-place operation on it must not reach the host tensor. The stand-in
    # keeps every tensor in the plain (ND) layout: a private format (npu_format != -1, e.g. NZ = 29)
    # changes the memory layout on the NPU, never the values, so it is not reproduced.
    del npu_format
    cpu = torch.from_numpy(host)
    return cpu, torch.from_numpy(host).to(get_npu_device() if device is None else device, copy=True)


def create_common_tensor(item, minValue, maxValue, device=None):
    """item = [numpy dtype, npu_format, shape]: uniform values in [minValue, maxValue) converted to the
    dtype; returns (host tensor, 'npu' tensor) with the same values in separate memory."""
    dtype, npu_format, shape = item[0], item[1], item[2]
    host = np.random.uniform(minValue, maxValue, shape).astype(dtype)
    return _paired(host, npu_format, device)


def create_dtype_tensor(shape, dtype, npu_format=-1, min_value=-5, max_value=5, no_zero=False, device=None):
    """(host tensor, 'npu' tensor) of a torch dtype: bool 0/1, half / float uniform in [min_value,
    max_value), anything else int32 integers in [min_value, max_value]; no_zero replaces zeros by ones."""
    if dtype == torch.bool:
        host = np.random.randint(0, 2, size=shape).astype(bool)
    elif dtype in (torch.half, torch.float):
        host = np.random.uniform(min_value, max_value, shape).astype(np.float16 if dtype == torch.half else np.float32)
    else:
        host = np.random.randint(min_value, max_value + 1, size=shape).astype(np.int32)
    if no_zero:
        host = np.where(host != 0, host, np.ones_like(host))
    return _paired(host, npu_format, device)


def iter_indices(tensor) -> Iterable:
    """Every index of the tensor (ints for 1-D, tuples above; nothing for a 0-d tensor)."""
    if tensor.dim() == 0:
        return range(0)
    if tensor.dim() == 1:
        return range(tensor.size(0))
    return itertools.product(*(range(s) for s in tensor.size()))


def is_iterable(obj) -> bool:
    try:
        iter(obj)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def freeze_rng_state():
    """Restores torch's CPU random state on exit."""
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)
