"""Worker of test_qat_dist.py: the same QAT run in one process (world 1) or in each of 2 gloo processes
(DDP or FSDP2), each rank on its half of the global batch. Writes the results of rank 0 with torch.save."""

from __future__ import annotations

import os
import sys


def make_model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


CONFIG = {"weights": {"num_bits": 4, "strategy": "channel", "learn_amax": True},
          "input_activations": {"num_bits": 8, "calibrator": "max", "learn_amax": True}}


def run(rank: int, world: int, modes: str, port: int, out: str, xquant_path: str = "") -> None:
    import torch

    torch.set_num_threads(1)
    import xquant
    if xquant_path and xquant_path not in xquant.__path__:
        xquant.__path__.append(xquant_path)
    import xquant.qat as xqat

    dist = torch.distributed
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        res = {mode: one(torch, xqat, rank, world, mode) for mode in modes.split(",")}
        if rank == 0:
            torch.save(res, out)
    finally:
        if world > 1:
            dist.destroy_process_group()


def one(torch, xqat, rank, world, mode):
    dist = torch.distributed
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 32, 16, generator=g)  # 8 steps of a global batch of 32
    y = torch.randn(8, 32, 4, generator=g)
    calib = torch.randn(3, 32, 16, generator=g) * 0.5  # small: training clips, amax learns
    per = 32 // world
    sl = slice(rank * per, (rank + 1) * per)
    model = make_model(torch)
    xqat.prepare(model, CONFIG)
    # the second layer's input quantizer calibrates with a histogram (its counts are summed across ranks)
    model[2].input_quantizer.calibrator = "percentile"
    model[2].input_quantizer.calib_options = {"percentile": 99.0, "num_bins": 256}
    xqat.calibrate(model, lambda m: [m(c[sl]) for c in calib])
    amax0 = {n: q.amax.detach().clone() for n, q in xqat.quantizers(model)}
    if mode == "ddp" and world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    elif mode == "fsdp2" and world > 1:
        from torch.distributed.fsdp import fully_shard

        for _, m in xqat.quant_modules(model):
            fully_shard(m)
        net = fully_shard(model)
    else:
        net = model
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses = []
    for step in range(x.shape[0]):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x[step, sl]), y[step, sl])
        loss.backward()
        opt.step()
        lv = loss.detach().clone()
        if world > 1:
            dist.all_reduce(lv)
            lv /= world
        losses.append(float(lv))
    final = {}
    for n, q in xqat.quantizers(model):
        a = q.amax
        a = a.full_tensor() if hasattr(a, "full_tensor") else a
        final[n] = a.detach().clone()
    if mode == "fsdp2":  # export gathers the sharded tensors on every rank; rank 0 writes
        xqat.export(net, os.environ["QAT_EXPORT_DIR"])
    return {"amax0": amax0, "losses": losses, "final": final}


if __name__ == "__main__":  # python qat_dist_worker.py RANK WORLD MODES(ddp,fsdp2) PORT OUT [XQUANT_PATH]
    a = sys.argv[1:]
    run(int(a[0]), int(a[1]), a[2], int(a[3]), a[4], a[5] if len(a) > 5 else "")
    # Leave without interpreter finalization. destroy_process_group() does not stop the gloo worker threads
    # while DeviceMesh / DDP state still holds the group, and such a thread that drops a finished
    # collective's tensors needs the GIL; taking it during finalization aborts the process ("terminate
    # called without an active exception", SIGABRT; seen about 1 run in 8 on 2 cores; torch's own bug,
    # pytorch/pytorch#190489). The results are already written and closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
