"""pytest configuration of the xquant Python suite: fixed thread count, importable helpers."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # golden.py, tutil.py

try:  # every test module requires torch and ml_dtypes (installed by scripts/setup-python) and skips,
    import torch  # naming the missing one, without them

    torch.set_num_threads(2)  # explicit, whatever the machine; xquant's own threads: xquant.set_num_threads
    torch.manual_seed(0)
except ImportError:
    # In CI a missing dependency is a failure, never a skip; except in the torch-free run of the NumPy tests
    # (scripts/test-python-numpy sets XQUANT_TORCH_FREE=1), whose point is that torch is absent.
    if os.environ.get("CI") == "true" and os.environ.get("XQUANT_TORCH_FREE") != "1":
        raise

if os.environ.get("CI") == "true":
    import ml_dtypes  # noqa: F401  (fails the run in CI instead of skipping the modules that need it)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)
