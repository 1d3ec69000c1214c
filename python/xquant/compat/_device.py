"""Device mapping of the stand-in: ``'npu'`` means the chosen device (the CPU by default).

Mechanism (fully reversible, nothing renamed in torch's C++ registry):

* a ``torch.overrides.TorchFunctionMode`` pushed on the mode stack rewrites ``device='npu'`` /
  ``'npu:N'`` keyword arguments of every torch function (factories such as torch.randn / zeros / tensor /
  empty / arange, ``*_like``, ``Tensor.new_*``, ``Tensor.to``), positional ``'npu'`` devices of
  ``Tensor.to`` / ``Module.to`` and ``torch.device('npu')`` itself (which then is the chosen device);
* ``Tensor.npu()``, ``Tensor.is_npu``, ``Module.npu()`` are added to the torch classes;
* a ``torch.npu`` namespace (is_available, device_count, current_device, set_device, synchronize, ...)
  is set as ``torch.npu`` and ``sys.modules['torch.npu']``.
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_NPU_RE = re.compile(r"npu(:\d+)?")


def is_npu_spec(d: Any) -> bool:
    return isinstance(d, str) and _NPU_RE.fullmatch(d.strip()) is not None


# Functions whose positional arguments may be a device (rewritten only for these).
_POSITIONAL = {torch.Tensor.to, torch._C._nn._parse_to}


def _check_index(spec: str, index=None) -> None:
    """The stand-in has one device, index 0 (like a machine with one NPU: npu:1 is an error there too)."""
    s = spec.strip()
    i = int(s.split(":")[1]) if ":" in s else (0 if index is None else index)
    if i != 0:
        raise RuntimeError(f"xquant.compat: device npu:{i} requested but the stand-in has one device, npu:0 "
                           f"(mapped to {_TARGET[0] if _TARGET else 'the chosen device'})")


class NpuDeviceMode(TorchFunctionMode):
    """Maps 'npu' devices to ``target`` in every torch function call."""

    def __init__(self, target: torch.device):
        super().__init__()
        self.target = target

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.device:
            spec = args[0] if args else kwargs.get("type")
            if is_npu_spec(spec):
                index = args[1] if len(args) > 1 else kwargs.get("index")
                _check_index(spec, index if isinstance(index, int) else None)
                return self.target
            return func(*args, **kwargs)
        dev = kwargs.get("device")
        if dev is not None and is_npu_spec(dev):
            _check_index(dev)
            kwargs = dict(kwargs)
            kwargs["device"] = self.target
        if func in _POSITIONAL and any(is_npu_spec(a) for a in args):
            for a in args:
                if is_npu_spec(a):
                    _check_index(a)
            args = tuple(self.target if is_npu_spec(a) else a for a in args)
        return func(*args, **kwargs)


def make_npu_namespace(target: torch.device) -> types.ModuleType:
    """The ``torch.npu`` / ``torch_npu.npu`` namespace: one device, the chosen one."""
    m = types.ModuleType("torch.npu", "xquant.compat stand-in for torch.npu: one 'npu' device, mapped to "
                         f"{target}.")
    on_cuda = target.type == "cuda"

    def is_available() -> bool:
        return True

    def device_count() -> int:
        return 1

    def current_device() -> int:
        return 0

    def _index(device) -> int:
        if device is None:
            return 0
        if isinstance(device, torch.device):
            return 0 if device.index is None else device.index
        if isinstance(device, str):
            if not is_npu_spec(device):
                raise ValueError(f"xquant.compat: device is {device!r} but expected 'npu' or 'npu:0'")
            return int(device.split(":")[1]) if ":" in device else 0
        if isinstance(device, int) and not isinstance(device, bool):
            return device
        raise TypeError(f"xquant.compat: device is {device!r} but expected an int, 'npu:N' or a torch.device")

    def set_device(device) -> None:
        i = _index(device)
        if i != 0:
            raise ValueError(f"xquant.compat: device index {i} requested but the stand-in has one device (0)")

    def synchronize(device=None) -> None:
        _index(device)
        if on_cuda:
            torch.cuda.synchronize(target)

    def empty_cache() -> None:
        if on_cuda:
            torch.cuda.empty_cache()

    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    def get_device_name(device=None) -> str:
        _index(device)
        return f"xquant.compat stand-in ({target})"

    def is_initialized() -> bool:
        return True

    def init() -> None:
        pass

    for f in (is_available, device_count, current_device, set_device, synchronize, empty_cache, manual_seed,
              get_device_name, is_initialized, init):
        f.__module__ = "torch.npu"
        setattr(m, f.__name__, f)
    m.manual_seed_all = manual_seed
    return m


def _npu_arg(what: str, device) -> torch.device:
    """The target device for ``.npu(device)``: None, 0, 'npu', 'npu:0' (or the target device itself)."""
    target = _state_target()
    if isinstance(device, int) and not isinstance(device, bool):
        _check_index("npu", device)
    elif is_npu_spec(device):
        _check_index(device)
    elif device is not None and not (isinstance(device, torch.device) and device == target):
        raise ValueError(f"xquant.compat: {what}.npu(device={device!r}): expected None, 0 or 'npu:0'")
    return target


def _tensor_npu(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    return self.to(_npu_arg("Tensor", device), non_blocking=non_blocking, memory_format=memory_format)


def _tensor_is_npu(self) -> bool:
    target = _state_target()
    return self.device.type == target.type


def _module_npu(self, device=None):
    target = _npu_arg("Module", device)
    return self._apply(lambda t: t.to(target))


_TARGET: list = []  # the chosen device while installed


def _state_target() -> torch.device:
    if not _TARGET:
        raise RuntimeError("xquant.compat is not installed (the 'npu' stand-in was uninstalled)")
    return _TARGET[0]


_MISSING = object()
_PATCHES = [
    (torch.Tensor, "npu", _tensor_npu),
    (torch.Tensor, "is_npu", property(_tensor_is_npu)),
    (torch.nn.Module, "npu", _module_npu),
]


class DeviceMapping:
    """Everything the device mapping changes, and how to undo it."""

    def __init__(self, target: torch.device):
        self.target = target
        self.mode = NpuDeviceMode(target)
        self.namespace = make_npu_namespace(target)
        self._saved: list = []
        self._active = False

    def apply(self) -> None:
        _TARGET[:] = [self.target]
        for owner, name, value in _PATCHES:
            self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
            setattr(owner, name, value)
        self._saved.append((torch, "npu", torch.__dict__.get("npu", _MISSING)))
        torch.npu = self.namespace
        self._saved_module = sys.modules.get("torch.npu", _MISSING)
        sys.modules["torch.npu"] = self.namespace
        self.mode.__enter__()
        self._active = True

    def undo(self) -> None:
        if not self._active:
            return
        from torch.overrides import _get_current_function_mode_stack

        stack = _get_current_function_mode_stack()
        if not stack or stack[-1] is not self.mode:
            raise RuntimeError("xquant.compat.uninstall(): another TorchFunctionMode entered after install() is "
                               "still active on this thread (exit it first), or this is not the thread that "
                               "called install()")
        self.mode.__exit__(None, None, None)
        for owner, name, old in reversed(self._saved):
            if old is _MISSING:
                if name in owner.__dict__:
                    delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved.clear()
        if self._saved_module is _MISSING:
            sys.modules.pop("torch.npu", None)
        else:
            sys.modules["torch.npu"] = self._saved_module
        _TARGET.clear()
        self._active = False
