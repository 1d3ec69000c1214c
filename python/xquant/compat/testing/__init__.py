"""``torch_npu.testing`` of the xquant.compat stand-in.

The parts of Ascend/pytorch's ``torch_npu.testing`` that peer test suites (op-plugin's custom-op tests,
DrivingSDK's, torch_npu's own) import, written for xquant:

* ``torch_npu.testing.testcase``: ``TestCase`` (unittest) with torch_npu's assertion helpers
  (``assertRtolEqual``, the precision-aware ``assertEqual`` / ``assertNotEqual`` / ``assertAlmostEqual``)
  and ``run_tests``;
* ``torch_npu.testing.common_utils``: ``SupportedDevices``, ``create_common_tensor``,
  ``create_dtype_tensor``, ``get_npu_device`` / ``set_npu_device`` and small helpers;
* ``torch_npu.testing.common_distributed``: ``skipIfUnsupportMultiNPU``.

``xquant.compat.install()`` registers them under those names (``uninstall`` removes them). The NPU model
the stand-in reports (``torch.npu.get_device_name()``, which ``SupportedDevices`` reads) is
``$XQUANT_NPU_DEVICE``, default ``Ascend910B4``: tests marked ``@SupportedDevices(['Ascend910B'])`` run.
"""

from __future__ import annotations

import types


def stand_in_modules(torch_npu_module: types.ModuleType) -> dict:
    """{sys.modules name: module} for the torch_npu.testing package; sets torch_npu_module.testing."""
    from . import common_distributed, common_utils, testcase

    pkg = types.ModuleType("torch_npu.testing", __doc__)
    pkg.__path__ = []  # a package: its submodules are the ones below, nothing else is found
    pkg.__xquant_compat__ = True
    modules = {"torch_npu.testing": pkg}
    for m in (testcase, common_utils, common_distributed):
        short = m.__name__.rsplit(".", 1)[1]
        setattr(pkg, short, m)
        modules["torch_npu.testing." + short] = m
    torch_npu_module.testing = pkg
    return modules
