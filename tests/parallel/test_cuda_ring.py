"""On two GPUs with NCCL: ring attention equals torch's own `context_parallel` (skipped elsewhere).

`context_parallel` shards the buffers itself (head and tail, as zigzag), runs SDPA's CUDA
kernels through its ring and returns each process's shard; `context_parallel_unshard` puts
the whole output back together. The package's ring runs on the same inputs, zigzag-sharded,
and its shards are gathered and put back with `zigzag_unshard`.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attention.parallel import ring_attention, spawn, zigzag_shard, zigzag_unshard

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _both(rank: int, world: int) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    device = torch.device("cuda", rank)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, device=device, generator=gen) for _ in range(3))
    pos = torch.arange(256, device=device)[None].expand(2, 256)
    mine = [zigzag_shard(t, pos, rank, world, dim=2)[0] for t in (q, k, v)]
    own = zigzag_shard(q, pos, rank, world, dim=2)[1]
    out = ring_attention(*mine, own)  # causal
    pieces = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(pieces, out)
    ours = zigzag_unshard(pieces, dim=2)
    mesh = init_device_mesh("cuda", (world,))
    cq, ck, cv = q.clone(), k.clone(), v.clone()
    with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2]):
        theirs = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True)
    (theirs,) = context_parallel_unshard(mesh, [theirs], [2])
    return float((ours - theirs).abs().max())


@pytest.mark.cuda
@pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA devices")
def test_ring_attention_equals_torch_context_parallel_on_two_gpus() -> None:
    for difference in spawn(_both, 2, backend="nccl", timeout=120):
        assert difference < 1e-4
