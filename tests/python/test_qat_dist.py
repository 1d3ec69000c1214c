"""xquant.qat under torch.distributed (issue 20): the same QAT run in one process on the global batch and in
2 gloo processes on its halves, with DDP and with FSDP2 (fully_shard), CPU only.

Checked: every calibrated amax (max calibrator, and a percentile histogram whose counts are summed across
ranks) is identical on the ranks and to the single process's, bit for bit; the per-step losses (mean over
the global batch) and the learned amax after 8 SGD steps agree within 1e-5 relative (the gradients are the
same sums taken in another order: DDP / FSDP2 average the two halves' gradients)."""

import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import xquant  # noqa: E402
import xquant.qat  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "qat_dist_worker.py")

if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _xquant_path() -> str:
    return [p for p in xquant.__path__ if p.endswith(os.path.join("python", "xquant"))][-1] \
        if len(xquant.__path__) > 1 else ""


def test_ddp_and_fsdp2_match_single_process(tmp_path):
    sys.path.insert(0, HERE)
    import qat_dist_worker

    single = tmp_path / "single.pt"
    qat_dist_worker.run(0, 1, "single", 0, str(single), _xquant_path())
    out = tmp_path / "two.pt"
    port = _port()
    env = dict(os.environ, OMP_NUM_THREADS="1", QAT_EXPORT_DIR=str(tmp_path / "export"))
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", "ddp,fsdp2", str(port), str(out), _xquant_path()],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    try:
        outs = [p.communicate(timeout=600)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    ref = torch.load(single)["single"]
    res = torch.load(out)
    for mode in ("ddp", "fsdp2"):
        r = res[mode]
        assert set(r["amax0"]) == set(ref["amax0"])
        for k, v in ref["amax0"].items():
            assert torch.equal(r["amax0"][k], v), (mode, k)  # calibration: exact
        assert len(r["losses"]) == len(ref["losses"]) == 8
        for a, b in zip(r["losses"], ref["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (mode, r["losses"], ref["losses"])
        moved = 0
        for k, v in ref["final"].items():
            assert torch.allclose(r["final"][k], v, rtol=1e-5, atol=1e-7), (mode, k, r["final"][k], v)
            moved += int(not torch.equal(v, ref["amax0"][k]))
        assert moved == len(ref["final"]), "every learnable amax should have moved in 8 steps"
    # FSDP2's export: the gathered learned ranges, written once
    from safetensors.torch import load_file

    t = load_file(tmp_path / "export" / "model.safetensors")
    fin = res["fsdp2"]["final"]
    for i in (0, 2, 4):
        want = xquant.qat.weight_scales(fin[f"{i}.weight_quantizer"], 4, torch.float32).reshape(-1, 1)
        assert torch.equal(t[f"{i}.weight_scale"], want), i
        assert torch.equal(t[f"{i}.input_scale"], fin[f"{i}.input_quantizer"].clamp_min(0) / 127), i
    assert sorted(os.listdir(tmp_path / "export")) == ["config.json", "model.safetensors"]
