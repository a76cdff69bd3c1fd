"""Benchmark jobs sharded across processes with torch.distributed: under torchrun every rank takes
every world-th job and rank 0 gathers the records (gloo on CPUs, nccl on GPUs); without torchrun it
is one process doing everything."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init(device: str) -> tuple[int, int, str]:
    """-> (rank, world size, this rank's device), joining the process group when torchrun started
    us. On GPUs each rank takes the GPU of its local rank (nccl needs one GPU per rank)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    cuda = device.startswith("cuda")
    if cuda:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), world, device


def take(jobs: list, rank: int, world: int) -> list:
    return jobs[rank::world]


def gather(records: list, rank: int, world: int) -> list:
    """Every rank's records, on rank 0 (other ranks get [])."""
    if world == 1:
        return records
    parts = [None] * world if rank == 0 else None
    dist.gather_object(records, parts, dst=0)
    dist.destroy_process_group()
    return [r for part in parts for r in part] if rank == 0 else []
