"""Captures the multi-rank PyTorch Kineto traces under tests/profiles/torch_ranks/ (committed; CI never runs this).

A real torch.distributed job on CPU: WORLD ranks spawned on this machine, the gloo backend over loopback, a small
MLP trained with DistributedDataParallel (its gradients all-reduced in buckets during the backward pass), each rank
profiled by torch.profiler (record_shapes=True, a wait/warmup/active schedule, so every step is a
`ProfilerStep#N` annotation) and exporting its own `rank{R}.pt.trace.json.gz` with its `distributedInfo`.

Two jobs:
- `balanced/`: every rank does the same work per step;
- `straggler/`: rank SLOW_RANK multiplies EXTRA_MATMULS more matrices before its forward pass each step (real
  compute, on its own data), so it reaches every all-reduce last and the other ranks wait for it inside it.

torch is not a dependency of xdiag: run this from a separate venv that has it (CPU build), then commit the files:

    python3 -m venv /work/torchvenv && /work/torchvenv/bin/pip install torch==2.13.0 numpy
    /work/torchvenv/bin/python tests/capture/torch_ranks.py --out tests/profiles/torch_ranks

The job pins each rank to one intra-op thread; on a machine with fewer cores than ranks the ranks time-share them,
which adds scheduling noise of a few ms to the balanced job.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
from pathlib import Path

WORLD = 4
SLOW_RANK = 2
EXTRA_MATMULS = 16
EXTRA_WIDTH = 384
WIDTH = 128
BATCH = 128
STEPS = dict(wait=1, warmup=2, active=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str, slow_rank: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(4 * WIDTH, 4 * WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(4 * WIDTH, 10),
    )
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)  # a few buckets: several all-reduces per step
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    extra = torch.randn(EXTRA_WIDTH, EXTRA_WIDTH, generator=generator) / EXTRA_WIDTH**0.5
    steps = sum(STEPS.values())

    def export(prof) -> None:
        prof.export_chrome_trace(str(Path(out) / f"rank{rank}.pt.trace.json"))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=schedule(**STEPS, repeat=1),
                 on_trace_ready=export) as prof:
        for _ in range(steps):
            x = torch.randn(BATCH, WIDTH, generator=generator)
            y = torch.randint(0, 10, (BATCH,), generator=generator)
            if rank == slow_rank:
                with record_function("extra_work"):
                    h = extra
                    for _ in range(EXTRA_MATMULS):
                        h = torch.tanh(h @ extra)
                    x = x + h[:BATCH].mean() * 0
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def capture(out: Path, slow_rank: int) -> None:
    import gzip

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(WORLD, _free_port(), tmp, slow_rank), nprocs=WORLD, join=True)
        out.mkdir(parents=True, exist_ok=True)
        for rank in range(WORLD):
            source = Path(tmp) / f"rank{rank}.pt.trace.json"
            with source.open("rb") as raw, gzip.open(out / f"rank{rank}.pt.trace.json.gz", "wb", compresslevel=9) as gz:
                shutil.copyfileobj(raw, gz)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path("tests/profiles/torch_ranks"))
    args = parser.parse_args()
    capture(args.out / "balanced", slow_rank=-1)
    capture(args.out / "straggler", slow_rank=SLOW_RANK)
    for path in sorted(args.out.rglob("*.gz")):
        print(path, path.stat().st_size)


if __name__ == "__main__":
    main()
