"""xquant.compat: torch_npu.testing in the stand-in, the reported NPU model, and device copies.

Peer test suites (op-plugin's custom-op tests, DrivingSDK's, torch_npu's own) import
torch_npu.testing.testcase / common_utils / common_distributed; these tests check the stand-in's versions
in their own words: the assertRtolEqual acceptance rule, the precision-aware assertEqual, SupportedDevices
against $XQUANT_NPU_DEVICE, create_common_tensor's separate host and 'npu' tensors, and that moves to and
from 'npu' copy (an in-place operation on one side never reaches the other).
"""

import pytest

pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")

import os
import subprocess
import sys
import textwrap
import unittest

import numpy as np
import torch

import xquant

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(xquant.__file__)))


def _run(args, env_extra=None, cwd=None, timeout=240):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "2")
    env.pop("XQUANT_NPU_DEVICE", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def npu(request):
    import xquant.compat as compat

    saved = os.environ.pop("XQUANT_NPU_DEVICE", None)
    assert not compat.is_installed()
    compat.install()
    try:
        yield sys.modules["torch_npu"]
    finally:
        compat.uninstall()
        if saved is not None:
            os.environ["XQUANT_NPU_DEVICE"] = saved
    assert not any(m.startswith("torch_npu") for m in sys.modules)


def _run_case(case_cls):
    """Runs a unittest.TestCase class; returns {test name: 'ok' | 'skip: reason' | 'fail: message'}."""
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(case_cls).run(result)
    out = {}
    for test in unittest.defaultTestLoader.loadTestsFromTestCase(case_cls):
        out[test._testMethodName] = "ok"
    for test, reason in result.skipped:
        out[test._testMethodName] = "skip: " + reason
    for test, tb in result.failures + result.errors:
        out[test._testMethodName] = "fail: " + tb.strip().splitlines()[-1]
    return out


# ---- the modules and the device name ------------------------------------------------------------------------

def test_modules_import_under_their_torch_npu_names(npu):
    import torch_npu.testing
    from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU
    from torch_npu.testing.common_utils import (SupportedDevices, create_common_tensor, create_dtype_tensor,
                                                get_npu_device, set_npu_device)
    from torch_npu.testing.testcase import TestCase, run_tests

    assert npu.testing is torch_npu.testing and issubclass(TestCase, unittest.TestCase)
    assert callable(run_tests) and callable(skipIfUnsupportMultiNPU) and callable(create_dtype_tensor)
    assert get_npu_device() == "npu:0" and set_npu_device() == "npu:0"
    with pytest.raises(ModuleNotFoundError):
        import torch_npu.testing.no_such_module  # noqa: F401


def test_device_name_is_the_default_model(npu):
    assert torch.npu.get_device_name() == "Ascend910B4" == torch.npu.get_device_name(0)
    assert npu.npu.get_device_name("npu:0") == "Ascend910B4"


def test_device_family_is_what_supported_devices_lists(npu):
    from torch_npu.testing.common_utils import device_family

    assert device_family("Ascend910B4") == "Ascend910B"
    assert device_family("Ascend910B1") == "Ascend910B"
    assert device_family("Ascend310P3") == "Ascend310P"
    assert device_family("Ascend910_9392") == "Ascend910_93"
    assert device_family("Ascend950PR_9579") == "Ascend950"


def test_supported_devices_and_multi_npu_skip(npu):
    from torch_npu.testing.common_distributed import skipIfUnsupportMultiNPU
    from torch_npu.testing.common_utils import SupportedDevices
    from torch_npu.testing.testcase import TestCase

    class Case(TestCase):
        @SupportedDevices(["Ascend910B"])
        def test_910b(self):
            pass

        @SupportedDevices(["Ascend910A", "Ascend910B"])
        def test_either(self):
            pass

        @SupportedDevices(["Ascend950"])
        def test_950(self):
            pass

        @skipIfUnsupportMultiNPU(2)
        def test_two_npus(self):
            pass

        @SupportedDevices(["Ascend910B"])
        def test_runs_and_fails(self):
            self.assertRtolEqual(torch.zeros(3), torch.ones(3))

    r = _run_case(Case)
    assert r["test_910b"] == "ok" and r["test_either"] == "ok", r
    assert r["test_950"].startswith("skip: runs only on ['Ascend950']; this device is Ascend910B"), r
    assert r["test_two_npus"].startswith("skip: needs 2 NPUs"), r
    assert r["test_runs_and_fails"].startswith("fail: AssertionError: result error"), r


SCRIPT = textwrap.dedent('''
    import torch, torch_npu
    from torch_npu.testing.testcase import TestCase, run_tests
    from torch_npu.testing.common_utils import SupportedDevices

    class T(TestCase):
        @SupportedDevices(['Ascend950'])
        def test_950(self):
            print("ran on", torch.npu.get_device_name())

        @SupportedDevices(['Ascend910B'])
        def test_910b(self):
            print("ran on", torch.npu.get_device_name())

    if __name__ == "__main__":
        run_tests()
''')


def test_run_tests_and_the_device_from_the_environment(tmp_path):
    script = tmp_path / "test_peer_style.py"
    script.write_text(SCRIPT)
    r = _run(["-m", "xquant.compat", str(script)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ran on Ascend910B4" in r.stdout and "OK (skipped=1)" in r.stderr, r.stdout + r.stderr
    r = _run(["-m", "xquant.compat", str(script), "-v"], {"XQUANT_NPU_DEVICE": "Ascend950PR_9579"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ran on Ascend950PR_9579" in r.stdout and "OK (skipped=1)" in r.stderr
    assert "this device is Ascend910B" not in r.stderr and "this device is Ascend950" in r.stderr
    r = _run(["-m", "xquant.compat", str(script)], {"XQUANT_NPU_DEVICE": "910B"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "XQUANT_NPU_DEVICE is '910B' but expected an Ascend NPU model name" in r.stderr
    r = _run(["-m", "xquant.compat", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)],
             {"XQUANT_NPU_DEVICE": ""}, cwd=str(tmp_path))
    assert r.returncode == 0 and "1 passed, 1 skipped" in r.stdout, r.stdout + r.stderr


def test_refused_device_name_changes_nothing():
    code = textwrap.dedent('''
        import os, sys, torch, xquant.compat as c
        try:
            c.install()
        except ValueError as e:
            print("refused:", e)
        print("state", c.is_installed(), "torch_npu" in sys.modules, hasattr(torch, "npu"),
              len(torch.overrides._get_current_function_mode_stack()))
    ''')
    r = _run(["-c", code], {"XQUANT_NPU_DEVICE": "Ascend 910B"})
    assert r.returncode == 0, r.stderr
    assert "refused: xquant.compat.install: XQUANT_NPU_DEVICE is 'Ascend 910B'" in r.stdout
    assert "state False False False 0" in r.stdout


# ---- assertion helpers --------------------------------------------------------------------------------------

def _outcome(fn):
    from torch_npu.testing.testcase import TestCase

    class Case(TestCase):
        def test(self):
            fn(self)

    return _run_case(Case)["test"]


def test_assert_rtol_equal_acceptance_rule(npu):
    ok = lambda fn: _outcome(fn) == "ok"  # noqa: E731
    x = torch.linspace(-3, 3, 10000)
    assert ok(lambda t: t.assertRtolEqual(x, x.clone()))
    assert ok(lambda t: t.assertRtolEqual(x, x * (1 + 5e-5)))  # within prec relatively
    # up to prec * size (= 1) elements may be off: one passes, two fail
    one, two = x.clone(), x.clone()
    one[7] += 1
    two[7:9] += 1
    assert ok(lambda t: t.assertRtolEqual(x, one))
    assert _outcome(lambda t: t.assertRtolEqual(x, two)).startswith("fail: AssertionError: result error: 2 of "
                                                                     "10000 elements")
    # float16 uses prec16 = 1e-3
    h = torch.linspace(1, 2, 100, dtype=torch.float16)
    assert ok(lambda t: t.assertRtolEqual(h, h + torch.tensor(2 ** -10, dtype=torch.float16)))
    assert _outcome(lambda t: t.assertRtolEqual(h, h + 0.01)).startswith("fail")
    # numpy arrays, numbers, lists of tensors, auto_trans_dtype
    assert ok(lambda t: t.assertRtolEqual(np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32)))
    assert ok(lambda t: t.assertRtolEqual([x, x.to(torch.int8)], [x.clone(), x.to(torch.int8)]))
    assert ok(lambda t: t.assertRtolEqual(x.to(torch.float16), x, auto_trans_dtype=True, prec=1e-3))
    # exact shape and dtype
    assert _outcome(lambda t: t.assertRtolEqual(x, x[:-1])).startswith("fail: AssertionError: shape error")
    assert _outcome(lambda t: t.assertRtolEqual(x, x.double())).startswith("fail: AssertionError: dtype error")
    assert "bfloat16" in _outcome(lambda t: t.assertRtolEqual(x.bfloat16(), x.bfloat16()))
    # integers are compared without wrap-around: int8 -128 against 127 is 255 apart, not 1
    a, b = torch.full((4,), -128, dtype=torch.int8), torch.full((4,), 127, dtype=torch.int8)
    assert _outcome(lambda t: t.assertRtolEqual(a, b)).startswith("fail")
    # bool exactly; NaN agrees with NaN, not with a number; equal infinities agree
    m = torch.tensor([True, False, True])
    assert ok(lambda t: t.assertRtolEqual(m, m.clone()))
    assert _outcome(lambda t: t.assertRtolEqual(m, ~m)).startswith("fail")
    s = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    assert ok(lambda t: t.assertRtolEqual(s, s.clone()))
    assert _outcome(lambda t: t.assertRtolEqual(s, torch.tensor([0.0, float("inf"), -float("inf"), 1.0]))
                    ).startswith("fail")


def test_assert_equal_with_precision(npu):
    ok = lambda fn: _outcome(fn) == "ok"  # noqa: E731
    x = torch.randn(100)
    assert ok(lambda t: t.assertEqual(x, x + 1e-6))  # default precision 1e-5
    assert _outcome(lambda t: t.assertEqual(x, x + 1e-3)).startswith("fail")
    assert ok(lambda t: t.assertEqual(x, x + 1e-3, prec=1e-2))
    assert ok(lambda t: t.assertEqual(x, x.double()))  # exact_dtype False by default
    assert _outcome(lambda t: t.assertEqual(x, x.double(), exact_dtype=True)).startswith("fail")
    assert ok(lambda t: t.assertEqual(x.numpy(), x))
    assert ok(lambda t: t.assertEqual(1.0, 1.0 + 1e-7) or t.assertEqual(torch.tensor(2.0), 2.0))
    assert ok(lambda t: t.assertEqual({"a": x, "b": [1, 2]}, {"a": x.clone(), "b": [1, 2]}))
    assert ok(lambda t: t.assertEqual("abc", "abc") or t.assertEqual(torch.Size([2]), (2,)))
    assert _outcome(lambda t: t.assertEqual(float("inf"), float("inf"))).startswith("fail")
    assert ok(lambda t: t.assertEqual(float("inf"), float("inf"), allow_inf=True))
    nan = torch.tensor([float("nan"), 1.0])
    assert ok(lambda t: t.assertEqual(nan, nan.clone()))
    assert _outcome(lambda t: t.assertEqual(nan, torch.tensor([1.0, float("nan")]))).startswith("fail")
    assert ok(lambda t: t.assertNotEqual(x, x + 1))
    assert _outcome(lambda t: t.assertNotEqual(x, x.clone())).startswith("fail")
    assert ok(lambda t: t.assertAlmostEqual(1.0, 1.004, places=2))
    assert _outcome(lambda t: t.assertAlmostEqual(1.0, 1.004, places=3)).startswith("fail")


def test_set_up_seeds_every_test_alike(npu):
    from torch_npu.testing.testcase import TestCase

    drawn = []

    class Case(TestCase):
        def test_a(self):
            drawn.append((torch.rand(3), np.random.rand(3)))

        def test_b(self):
            drawn.append((torch.rand(3), np.random.rand(3)))

    assert set(_run_case(Case).values()) == {"ok"}
    assert torch.equal(drawn[0][0], drawn[1][0]) and np.array_equal(drawn[0][1], drawn[1][1])


def test_create_common_tensor_gives_separate_host_and_npu_tensors(npu):
    from torch_npu.testing.common_utils import create_common_tensor, create_dtype_tensor

    np.random.seed(0)
    cpu, dev = create_common_tensor([np.float16, 2, [4, 5]], -2, 2)
    assert cpu.dtype == dev.dtype == torch.float16 and cpu.shape == dev.shape == (4, 5) and dev.is_npu
    assert torch.equal(cpu, dev) and bool((cpu >= -2).all() and (cpu < 2).all())
    dev.add_(1)  # the NPU tensor is its own memory
    assert torch.equal(cpu + 1, dev)
    cpu, dev = create_common_tensor([np.int8, 29, [16]], -127, 127)  # a private format: same values
    assert cpu.dtype == torch.int8 and torch.equal(cpu, dev)
    cpu, dev = create_dtype_tensor([8], torch.int32, min_value=-1, max_value=1, no_zero=True)
    assert cpu.dtype == torch.int32 and bool((cpu != 0).all()) and torch.equal(cpu, dev)
    dev.zero_()
    assert bool((cpu != 0).all())


# ---- device copies ------------------------------------------------------------------------------------------

def test_moves_to_and_from_npu_copy(npu):
    host = torch.arange(6, dtype=torch.float32)

    def separate(moved, src, value=100.0):
        before = src.clone()
        moved.fill_(value)
        return torch.equal(src, before)

    assert separate(host.to("npu"), host)
    assert separate(host.to("npu:0"), host)
    assert separate(host.to(device="npu"), host)
    assert separate(host.npu(), host) and separate(host.npu(0), host)
    assert separate(host.to("npu", torch.float16), host)  # converted and moved: one new tensor
    dev = torch.arange(6, dtype=torch.float32, device="npu")
    assert separate(dev.cpu(), dev) and separate(dev.to("cpu"), dev) and separate(dev.to(device="cpu"), dev)
    arr = np.arange(6, dtype=np.float32)
    for make in (lambda: torch.as_tensor(arr, device="npu"), lambda: torch.asarray(arr, device="npu"),
                 lambda: torch.as_tensor(arr, dtype=torch.float32, device="npu"),
                 lambda: torch.as_tensor(data=arr, device="npu"),
                 lambda: torch.as_tensor(host, device="npu"), lambda: torch.asarray(host, device="npu")):
        t = make()
        t.fill_(-1)
        assert arr.tolist() == list(range(6)) and host.tolist() == list(range(6))
    # what is not a move keeps torch's rules: no copy without a device, none for a dtype-only .to
    assert host.to(torch.float32) is host and host.to(dtype=torch.float32) is host
    m = torch.nn.Linear(3, 2)
    w = m.weight.detach()
    m.npu()
    with torch.no_grad():
        m.weight.fill_(7)
    assert not bool((w == 7).any())
    # gradients flow through the copies
    g = torch.ones(3, requires_grad=True)
    (g.npu() * 2).cpu().sum().backward()
    assert g.grad.tolist() == [2.0, 2.0, 2.0]
