"""Device mapping of the stand-in: ``'npu'`` means the chosen device (the CPU by default).

Mechanism (fully reversible, nothing renamed in torch's C++ registry):

* a ``torch.overrides.TorchFunctionMode`` pushed on the mode stack rewrites ``device='npu'`` /
  ``'npu:N'`` keyword arguments of every torch function (factories such as torch.randn / zeros / tensor /
  empty / arange, ``*_like``, ``Tensor.new_*``, ``Tensor.to``), positional ``'npu'`` devices of
  ``Tensor.to`` / ``Module.to`` and ``torch.device('npu')`` itself (which then is the chosen device);
* ``Tensor.npu()``, ``Tensor.is_npu``, ``Module.npu()`` are added to the torch classes;
* a ``torch.npu`` namespace (is_available, device_count, current_device, set_device, synchronize, ...)
  is set as ``torch.npu`` and ``sys.modules['torch.npu']``.

Copies: 'npu' tensors live on the chosen device, so a host tensor and an 'npu' tensor would be the same
object where torch finds nothing to move. Moves therefore copy, as on the NPU: ``x.to('npu')``,
``x.npu()``, ``Module.npu()``, ``torch.as_tensor`` / ``torch.asarray(..., device='npu')`` and, when 'npu'
is the CPU, ``x.cpu()`` / ``x.to('cpu')`` return a new tensor (one copy; the NPU makes one too).
``x.to(torch.device('npu'))`` and ``Module.to(...)`` follow torch's rule (no copy when already there):
``torch.device('npu')`` *is* the chosen device, so such a call cannot be told from a no-op.
"""

from __future__ import annotations

import os
import re
import sys
import threading
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


def _is_host_spec(d: Any) -> bool:
    return isinstance(d, str) and d.strip() in ("cpu", "cpu:0")


class NpuDeviceMode(TorchFunctionMode):
    """Maps 'npu' devices to ``target`` in every torch function call. ``active`` False (an uninstall from
    another thread than the one whose mode stack holds it) makes it pass every call through unchanged."""

    def __init__(self, target: torch.device):
        super().__init__()
        self.target = target
        self.active = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        if func is torch.device:
            spec = args[0] if args else kwargs.get("type")
            if is_npu_spec(spec):
                index = args[1] if len(args) > 1 else kwargs.get("index")
                _check_index(spec, index if isinstance(index, int) else None)
                return self.target
            return func(*args, **kwargs)
        moved = False  # an explicit move between the host and 'npu': the result must not alias the input
        dev = kwargs.get("device")
        if dev is not None and is_npu_spec(dev):
            _check_index(dev)
            kwargs = dict(kwargs)
            kwargs["device"] = self.target
            moved = True
        if func in _POSITIONAL and any(is_npu_spec(a) for a in args):
            for a in args:
                if is_npu_spec(a):
                    _check_index(a)
            args = tuple(self.target if is_npu_spec(a) else a for a in args)
            moved = True
        if self.target.type == "cpu":
            if func is torch.Tensor.cpu:  # an 'npu' tensor may be this very CPU tensor: copy, as the NPU does
                return torch.Tensor.to(args[0], "cpu", copy=True, **kwargs)
            if func is torch.Tensor.to and (_is_host_spec(kwargs.get("device"))
                                            or any(_is_host_spec(a) for a in args[1:])):
                moved = True
        if moved and func is torch.Tensor.to:
            kwargs = dict(kwargs)
            kwargs["copy"] = True  # one copy; a dtype conversion in the same call makes no second one
        elif moved and func is torch.as_tensor:  # as_tensor(data, *, dtype, device) shares a host array's memory
            kw = dict(kwargs)
            data = args[0] if args else kw.pop("data")
            return torch.asarray(data, copy=True, **kw)
        elif moved and func is torch.asarray:
            return func(*args, **{**kwargs, "copy": True})
        return func(*args, **kwargs)


_DEVICE_NAME_RE = re.compile(r"Ascend\d{3}\w*")
DEFAULT_DEVICE_NAME = "Ascend910B4"


def device_name_from_env() -> str:
    """The NPU model torch.npu.get_device_name() reports: $XQUANT_NPU_DEVICE (unset or empty: Ascend910B4).
    torch_npu.testing's SupportedDevices decides by it which peer tests run."""
    name = os.environ.get("XQUANT_NPU_DEVICE", "") or DEFAULT_DEVICE_NAME
    if not _DEVICE_NAME_RE.fullmatch(name):
        raise ValueError(f"xquant.compat.install: XQUANT_NPU_DEVICE is {name!r} but expected an Ascend NPU model "
                         "name such as 'Ascend910B4', 'Ascend910_9392' or 'Ascend310P3' (Ascend, three digits, "
                         "then letters, digits or _)")
    return name


def make_npu_namespace(target: torch.device, device_name: str) -> types.ModuleType:
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
        """The NPU model the stand-in reports: $XQUANT_NPU_DEVICE at install, default Ascend910B4."""
        _index(device)
        return device_name

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
    # A new tensor, as on the NPU: an in-place operation on it must leave the host tensor as it was.
    return self.to(_npu_arg("Tensor", device), non_blocking=non_blocking, memory_format=memory_format, copy=True)


def _tensor_is_npu(self) -> bool:
    target = _state_target()
    return self.device.type == target.type


def _module_npu(self, device=None):
    target = _npu_arg("Module", device)
    return self._apply(lambda t: t.to(target, copy=True))  # parameters and buffers get their own memory


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


def drop_inert_modes() -> None:
    """Pops the switched-off NpuDeviceModes at the top of this thread's mode stack (see DeviceMapping.undo)."""
    from torch.overrides import _get_current_function_mode_stack

    while True:
        stack = _get_current_function_mode_stack()
        if not stack or not isinstance(stack[-1], NpuDeviceMode) or stack[-1].active:
            return
        stack[-1].__exit__(None, None, None)


class DeviceMapping:
    """Everything the device mapping changes, and how to undo it."""

    def __init__(self, target: torch.device, device_name: str):
        self.target = target
        self.mode = NpuDeviceMode(target)
        self.namespace = make_npu_namespace(target, device_name)
        self._saved: list = []
        self._active = False
        self._thread = None  # the thread whose mode stack holds self.mode

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
        self._thread = threading.get_ident()
        self._active = True

    def undo(self) -> None:
        if not self._active:
            return
        from torch.overrides import _get_current_function_mode_stack

        if threading.get_ident() == self._thread:
            stack = _get_current_function_mode_stack()
            if not stack or stack[-1] is not self.mode:
                raise RuntimeError("xquant.compat.uninstall(): another TorchFunctionMode entered after install() "
                                   "is still active on this thread (exit it first)")
            self.mode.__exit__(None, None, None)
        else:
            # Another thread's mode stack cannot be changed from here: the mode stays there, switched off
            # (it passes every call through), until that thread ends or installs again.
            self.mode.active = False
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
