"""xquant without torch: the package imports and computes on NumPy arrays in a process where torch is not
importable (scripts/test-python-numpy runs this file in a torch-free virtual environment; in the project
venv the same checks run in a subprocess that blocks `import torch`)."""

import os
import subprocess
import sys

import numpy as np
import pytest

CHECK = r"""
import sys
import numpy as np
import xquant
assert sys.modules.get("torch") is None, "import xquant imported torch"
x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
y = xquant.npu_fake_tensor_quant(x, np.float32(2.0))
assert isinstance(y, np.ndarray) and y.dtype == np.float32
q = xquant.npu_quantize(x, np.float32([0.1]), None, "quint4x2", -1, False)
assert q.shape == (4, 2) and q.dtype == np.int32
yq, s, o = xquant.npu_dynamic_quant_asymmetric(x)
assert yq.dtype == np.int8 and s.shape == (4,)
out = np.empty((4, 16), np.int8)
xquant.quant(out, x, np.full((4, 1), 4.0, np.float32))
assert [a.shape for a in xquant.acts_ulq(x, np.float32(-1), np.float32(1))] == [(4, 16)] * 4
try:
    xquant.register_torch_ops()
except ImportError as e:
    print("torch side:", type(e).__name__, e)
else:
    raise AssertionError("register_torch_ops() without torch did not raise")
print("ok")
"""

BLOCK_TORCH = "import sys; sys.modules['torch'] = None\n"  # `import torch` then raises ImportError


def test_numpy_without_torch():
    """The whole NumPy path in a process where `import torch` fails."""
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", BLOCK_TORCH + CHECK], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok")
    assert "torch side: ImportError" in r.stdout or "torch side: ModuleNotFoundError" in r.stdout


def test_numpy_errors_name_the_argument():
    import xquant

    with pytest.raises(ValueError, match=r"^xquant::fake_tensor_quant_with_axis: amax has shape \[4\] but inputs "
                                         r"has 3 channels on axis 1"):
        xquant.npu_fake_tensor_quant_with_axis(np.ones((2, 3), np.float32), np.ones(4, np.float32), 1)
    with pytest.raises(TypeError, match=r"^xquant::fake_tensor_quant: inputs has dtype float64"):
        xquant.npu_fake_tensor_quant(np.ones(3), np.float32(1.0))
