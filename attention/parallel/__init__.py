"""Attention across processes: ring attention on torch.distributed, and sequences split for it.

- [`attention.parallel.blocks`][attention.parallel.blocks]: one key/value block's output and
  log-sum-exp and its backward, by the layer's
  [`attention.layer.split_kv`][attention.layer.split_kv] (whose `merge` is the log-sum-exp
  rule), and a ring step's cost.
- [`attention.parallel.ring`][attention.parallel.ring]: `ring_attention`, forward and backward
  around a ring of processes.
- [`attention.parallel.shards`][attention.parallel.shards]: contiguous and zigzag shards, with
  their positions.
- [`attention.parallel.training`][attention.parallel.training]: a model trained across
  processes (DDP, FSDP2, ring attention in every layer) against one process.
- [`attention.parallel.launch`][attention.parallel.launch]: processes joined in a group, with
  bounded waits (tests, pages).
"""

from attention.layer.split_kv import merge
from attention.parallel.blocks import block_attention
from attention.parallel.launch import spawn
from attention.parallel.ring import ring_attention
from attention.parallel.shards import (
    causal_pairs,
    contiguous_shard,
    zigzag_shard,
    zigzag_unshard,
)

__all__ = [
    "block_attention",
    "causal_pairs",
    "contiguous_shard",
    "merge",
    "ring_attention",
    "spawn",
    "zigzag_shard",
    "zigzag_unshard",
]
