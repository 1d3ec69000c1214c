"""Run code written for Ascend NPUs unchanged, off the NPU: a stand-in for ``torch_npu`` and ``mx_driving``.

Opt-in; nothing happens on ``import xquant``::

    import xquant.compat
    xquant.compat.install()          # device="cpu" by default
    import torch, torch_npu          # the stand-in modules
    from mx_driving import npu_fake_tensor_quant
    x = torch.randn(4, 16, device='npu')              # a CPU tensor
    y, scale = torch_npu.npu_dynamic_quant(x)         # = torch.ops.npu.npu_dynamic_quant(x)
    xquant.compat.uninstall()        # everything restored

or from the shell, running a script as ``__main__`` under the stand-in::

    python -m xquant.compat [--device DEV] SCRIPT [ARGS...]
    python -m xquant.compat [--device DEV] -m MODULE [ARGS...]

What ``install`` does (``uninstall`` undoes each of it):

* ``sys.modules['torch_npu']`` (``torch_npu.npu_quantize``, ``npu_dynamic_quant``,
  ``npu_dynamic_quant_asymmetric``, ``npu_anti_quant``, ``torch_npu.npu``), ``sys.modules['mx_driving']``
  (``npu_fake_tensor_quant``, ``npu_fake_tensor_quant_inplace``, ``npu_fake_tensor_quant_with_axis``) and,
  unless a real one is importable, ``pypto_pro.language`` (an eager interpreter of the tile-language subset
  of seed 03's kernel: jit, Tensor annotations, tile groups, load, quant, store);
* ``torch.ops.npu.<name>`` for those four torch_npu operators, with torch_npu's schemas, a kernel computed
  by xquant on the CPU and a fake implementation (torch.compile / torch.export);
* ``device='npu'`` / ``'npu:0'`` / ``torch.device('npu')`` / ``Tensor.npu()`` / ``Module.npu()`` mean
  ``device`` (a TorchFunctionMode on this thread's mode stack; see ``_device``; moves copy, as on a
  device); ``Tensor.is_npu`` and ``torch.npu`` (is_available, device_count, current_device, set_device,
  synchronize, get_device_name = ``$XQUANT_NPU_DEVICE`` or ``Ascend910B4``, ...);
* ``torch_npu.testing`` (``testcase``, ``common_utils``, ``common_distributed``): what peer test suites
  import, so they run under ``python -m xquant.compat -m pytest TEST_FILE`` (see ``testing``).

``install`` / ``uninstall`` are process-wide and may be called from any thread; they put back exactly what
``sys.modules`` held (a module, an import blocker ``None``, or nothing).

It refuses (RuntimeError) when a real ``torch_npu`` is importable: then the NPU is the right place to run.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from typing import Optional

__all__ = ["install", "uninstall", "is_installed", "installed_device"]


class _State:
    def __init__(self, device, lib, mapping, saved_modules):
        self.device = device
        self.lib = lib
        self.mapping = mapping
        self.saved_modules = saved_modules


# The install state is process-wide: one install, undone by uninstall() from any thread. The lock makes
# install / uninstall from several threads at once take effect one after the other.
_lock = threading.RLock()
_state: Optional[_State] = None
_MODULE_NAMES = ("torch_npu", "torch_npu.npu", "torch_npu.testing", "torch_npu.testing.testcase",
                 "torch_npu.testing.common_utils", "torch_npu.testing.common_distributed", "mx_driving",
                 "pypto_pro", "pypto_pro.language")
_ABSENT = object()  # a name that was not in sys.modules (None there is an import blocker: kept as it is)


def _real_torch_npu_origin() -> Optional[str]:
    """Where a real torch_npu would be imported from, or None."""
    mod = sys.modules.get("torch_npu")
    if mod is not None and not getattr(mod, "__xquant_compat__", False):
        return getattr(mod, "__file__", None) or "sys.modules['torch_npu']"
    if mod is not None:
        return None  # our own stand-in
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]


def _target_device(device) -> "torch.device":
    import torch

    if isinstance(device, str) and device.split(":")[0].strip() == "npu":
        raise ValueError(f"xquant.compat.install: device is {device!r} but expected the device that 'npu' maps to "
                         "(e.g. 'cpu')")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"xquant.compat.install: device is {device!r} but expected a torch device such as 'cpu' "
                         f"({e})") from None
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"xquant.compat.install: device is {device!r} but CUDA is not available")
    if d.type == "meta":
        raise ValueError("xquant.compat.install: device is 'meta' but expected a device that holds data")
    return d


def install(device: str = "cpu") -> None:
    """Installs the stand-in in this process: ``'npu'`` becomes ``device`` (default ``'cpu'``). The
    operators compute on that device when xquant can (the CPU; a CUDA device where xquant.cuda_available());
    otherwise their inputs are copied to the CPU and the results back. Calling it again with the same device
    does nothing; with another device it raises (uninstall first). The install is process-wide (any thread
    may uninstall it); the ``'npu'`` device strings work on the thread that called it."""
    global _state
    with _lock:
        origin = _real_torch_npu_origin()  # before importing torch: a real torch_npu is never imported here
        if origin is not None:
            raise RuntimeError(f"xquant.compat.install: a real torch_npu is importable ({origin}); run the code "
                               "on the NPU with it, or remove it from the path to use the xquant stand-in")
        import torch

        import xquant
        from . import _device, _modules, _ops
        from .testing import stand_in_modules

        target = _target_device(device)
        npu_name = _device.device_name_from_env()  # XQUANT_NPU_DEVICE, checked before anything changes
        if _state is not None:
            if _state.device == target:
                return
            raise RuntimeError(f"xquant.compat.install: already installed with device {_state.device}; "
                               "call xquant.compat.uninstall() first")
        _device.drop_inert_modes()  # left on this thread by an uninstall() from another thread
        xquant.register_torch_ops()
        try:
            lib = _ops.register()
        except RuntimeError as e:
            raise RuntimeError("xquant.compat.install: could not define the torch.ops.npu quantization operators "
                               f"(already registered by something else?): {e}") from None
        mapping = _device.DeviceMapping(target, npu_name)
        saved = {name: sys.modules.get(name, _ABSENT) for name in _MODULE_NAMES}
        try:
            mapping.apply()
            tnpu = _modules.make_torch_npu(mapping.namespace, xquant.__version__)
            sys.modules["torch_npu"] = tnpu
            sys.modules["torch_npu.npu"] = mapping.namespace
            for name, module in stand_in_modules(tnpu).items():
                sys.modules[name] = module
            sys.modules["mx_driving"] = _modules.make_mx_driving(xquant.__version__)
            if "pypto_pro" not in sys.modules and importlib.util.find_spec("pypto_pro") is None:
                from . import _pypto

                sys.modules["pypto_pro"], sys.modules["pypto_pro.language"] = _pypto.make_modules()
        except Exception:
            mapping.undo()
            _restore_modules(saved)
            _ops.unregister(lib)
            raise
        _state = _State(target, lib, mapping, saved)


def _restore_modules(saved: dict) -> None:
    """Puts back exactly what sys.modules held: a module, an import blocker (None), or nothing."""
    for name, old in saved.items():
        if old is _ABSENT:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = old


def uninstall() -> None:
    """Undoes ``install``, from any thread: the stand-in modules leave sys.modules (what was there before,
    an import blocker ``sys.modules['torch_npu'] = None`` included, comes back), the torch.ops.npu operators
    are deregistered, the device mode is popped and the patched torch attributes are restored. Afterwards
    ``device='npu'`` fails again as in plain PyTorch. (Objects already bound by the script, e.g. a
    ``torch_npu`` module object it imported, still exist, but their operators no longer resolve.)
    Called from another thread than install's, the device mode on the installing thread's mode stack is
    switched off (it then passes every call through unchanged) since one thread cannot pop another's mode;
    the next install on that thread removes it. Does nothing when not installed."""
    global _state
    with _lock:
        if _state is None:
            return
        from . import _ops

        _state.mapping.undo()  # raises, changing nothing, if another mode sits on top of ours (same thread)
        _restore_modules(_state.saved_modules)
        _ops.unregister(_state.lib)
        _state = None


def is_installed() -> bool:
    with _lock:
        return _state is not None


def installed_device():
    """The torch.device that 'npu' maps to, or None when not installed."""
    with _lock:
        return None if _state is None else _state.device
