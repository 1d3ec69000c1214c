"""Large torch outputs are allocated by xquant (huge-page backed, 2 MiB aligned, reused by its allocation
cache); they must behave as ordinary torch tensors and give the same bits as the small-output path."""
import gc

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup-python installs it)")

import xquant
from xquant import npu


def test_large_output_is_xquant_memory_and_an_ordinary_tensor():
    torch.manual_seed(0)
    x = torch.randn(1 << 20)  # 4 MiB of float32: above the 2 MiB threshold
    amax = x.abs().max().reshape(1)
    y = npu.npu_fake_tensor_quant(x, amax)
    assert y.data_ptr() % (2 << 20) == 0
    assert y.dtype == torch.float32 and y.shape == x.shape and y.is_contiguous()
    # same bits as the chunks computed through the small-output path
    small = torch.cat([npu.npu_fake_tensor_quant(c, amax) for c in x.split(1 << 15)])
    assert torch.equal(y.view(torch.int32), small.view(torch.int32))
    z = (y * 2).clone()  # usable by torch like any tensor
    assert torch.equal(z, y * 2)


def test_freed_outputs_are_reused():
    x = torch.randn(1 << 20)
    amax = x.abs().max().reshape(1)
    y = npu.npu_fake_tensor_quant(x, amax)
    ptr = y.data_ptr()
    del y
    gc.collect()
    y2 = npu.npu_fake_tensor_quant(x, amax)
    assert y2.data_ptr() == ptr
    assert xquant._core.get_memory_cache_limit() > 0


def test_int8_and_bfloat16_outputs():
    x = torch.randn(4096, 1024, dtype=torch.bfloat16)
    y, scale, offset = npu.npu_dynamic_quant_asymmetric(x)
    assert y.dtype == torch.int8 and y.data_ptr() % (2 << 20) == 0
    w = torch.randn(2048, 1024, dtype=torch.bfloat16)
    q = npu.npu_fake_tensor_quant(w, w.float().abs().max().reshape(1).to(torch.bfloat16))
    assert q.dtype == torch.bfloat16 and q.shape == w.shape


def test_memory_cache_limit_setting():
    saved = xquant.get_memory_cache_limit()
    try:
        xquant.set_memory_cache_limit(0)
        assert xquant.get_memory_cache_limit() == 0
        x = torch.randn(1 << 20)
        y = npu.npu_fake_tensor_quant(x, x.abs().max().reshape(1))  # still correct without the cache
        assert torch.equal(y, npu.npu_fake_tensor_quant(x.clone(), x.abs().max().reshape(1)))
        import pytest

        with pytest.raises(ValueError, match="nbytes is -1"):
            xquant.set_memory_cache_limit(-1)
    finally:
        xquant.set_memory_cache_limit(saved)
