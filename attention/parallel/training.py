r"""Training across processes: data parallel (DDP, FSDP2) and sequence parallel (ring attention).

One step on a global batch, three ways over $P$ processes, each equal to one process's step:

- **DDP** (`DistributedDataParallel`): every process holds the whole model and $1/P$ of the
  rows; the gradients are averaged (all-reduce) during the backward.
- **FSDP2** (`fully_shard`): every process holds $1/P$ of each parameter too, gathers a
  layer's weights just before using them and reduce-scatters its gradients.
- **Ring** (sequence parallel): every process holds the whole model and all the rows, but
  $1/P$ of each sequence (a zigzag shard); each block's attention is
  [`ring_attention`][attention.parallel.ring.ring_attention] and everything else is per token.
  Process $r$'s loss is $\sum_{i \in \text{shard } r} \ell_i / N$ ($N$ the batch's
  tokens), so the losses and gradients summed over processes are the global mean's.

[`train_steps`][attention.parallel.training.train_steps] runs one of them in each process (or
the single-process step); the model comes from a function, so this module knows no model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from attention.layer.multihead import MultiHeadAttention
from attention.layer.tokens import Tokens
from attention.parallel.ring import ring_attention
from attention.parallel.shards import zigzag_shard

__all__ = ["RingAttention", "compare_training", "ring_layers", "train_steps"]

HOW = ("single", "ddp", "fsdp", "ring")


class RingAttention(nn.Module):
    """A `MultiHeadAttention`'s weights, its attention computed by `ring_attention`.

    Args:
        att: the layer (self-attention, no dropout on weights, no sink logit, default scale).
        group: the process group the sequence is split over; default the world.

    Raises:
        ValueError: a layer whose attention this cannot compute.
    """

    def __init__(self, att: MultiHeadAttention, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if att.sink_logits is not None or att.scale is not None or att.dropout.p:
            raise ValueError(
                "RingAttention: att must have no sink logit, the default scale and dropout 0, "
                f"got {att.extra_repr()}, dropout={att.dropout.p}"
            )
        self.att, self.group = att, group

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        angles: tuple[Tensor, Tensor] | None = None,
        **unused: Any,
    ) -> Tensor:
        """`x` `(b, T, d_in)`, this process's shard; `positions` `(b, T)` its tokens' positions."""
        if (
            positions is None
            or key_padding_mask is not None
            or any(v is not None for v in unused.values())
        ):
            raise ValueError(
                "RingAttention needs positions (batch, tokens), and no padding "
                "mask, cache or documents (put them in the mask)"
            )
        b, num_tokens, _ = x.shape
        tokens = Tokens(b, num_tokens, x.device, given=positions)
        q, k, v = self.att.project(x, tokens, angles)  # (b, h | h_kv, T, d_h)
        spec = self.att.spec
        out = ring_attention(
            q, k, v, positions, mask=spec.mask, score_mods=spec.score_mods, group=self.group
        )
        out = out.transpose(1, 2).reshape(b, num_tokens, self.att.d_out)  # (b, T, d_out)
        if self.att.W_gate is not None:  # output_gate: heads * sigma(x W_g), as the layer
            out = out * torch.sigmoid(self.att.W_gate(x))
        result: Tensor = self.att.out_proj(out)
        return result


def ring_layers(model: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """`model` with each `MultiHeadAttention` inside it wrapped in a `RingAttention` (in place)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MultiHeadAttention):
                setattr(parent, name, RingAttention(child, group))
    return model


def _setup(
    how: str, model: nn.Module, rank: int, world: int, ids: Tensor, targets: Tensor
) -> tuple[nn.Module, Tensor, Tensor, Tensor | None]:
    """The model as `how` trains it, and this process's ids, targets and positions."""
    if how == "ring":
        ids, pos = zigzag_shard(ids, None, rank, world)  # (b, T / P): a shard of each row
        return ring_layers(model), ids, zigzag_shard(targets, None, rank, world)[0], pos
    if how == "single":
        return model, ids, targets, None
    ids, targets = ids.tensor_split(world)[rank], targets.tensor_split(world)[rank]  # rows
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model), ids, targets, None
    from torch.distributed.fsdp import fully_shard

    with torch.no_grad():  # FSDP2 shards contiguous parameters only (GPTModel's are transposed)
        for p in model.parameters():
            p.data = p.data.contiguous()
    for child in model.modules():  # each block its own unit, then the rest
        if type(child).__name__ == "TransformerBlock":
            fully_shard(child)
    fully_shard(model)
    return model, ids, targets, None


def _full(t: Tensor) -> Tensor:
    """A tensor as a whole (an FSDP2 shard, a `DTensor`, gathered), detached."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()


def train_steps(
    rank: int,
    world: int,
    make_model: Callable[[], nn.Module],
    ids: Tensor,
    targets: Tensor,
    how: str,
    *,
    steps: int = 2,
    lr: float = 0.1,
) -> dict[str, Any]:
    """`steps` SGD steps of next-token cross-entropy, in one process of `world` (or alone).

    Args:
        rank: this process (`how="single"`: ignored).
        world: how many processes share the work.
        make_model: builds the model (seeded here with 0, then cast to float64): the same
            weights in every process.
        ids: the global batch of token ids, `(batch, tokens)`, the same in every process.
        targets: the next tokens, `(batch, tokens)`.
        how: `"single"`, `"ddp"`, `"fsdp"` or `"ring"`.
        steps: optimiser steps.
        lr: SGD's learning rate.

    Returns:
        `losses` (the global batch's mean loss at each step), `grads` (the first step's
        gradients, whole, by parameter name) and `params` (the parameters after the last step).
    """
    if how not in HOW:
        raise ValueError(f"how must be one of {HOW}, got {how!r}")
    torch.manual_seed(0)
    model, x, y, pos = _setup(how, make_model().double(), rank, world, ids, targets)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad()
        logits = model(x) if pos is None else model.logits(x, positions=pos)  # type: ignore[operator]
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.numel()
        if how == "ring":  # this shard's share of the global mean: the shares add up to it
            loss = loss * y.numel() / ids.numel()
        loss.backward()
        total = loss.detach().clone()
        if how != "single":
            dist.all_reduce(total)  # ddp, fsdp: the mean of P equal halves' means
            total = total if how == "ring" else total / world
        if how == "ring":
            for p in model.parameters():  # each process's tokens' share of the gradient
                assert p.grad is not None
                dist.all_reduce(p.grad)
        losses.append(float(total))
        if step == 0:
            grads = {_name(n): _full(p.grad) for n, p in model.named_parameters()}  # type: ignore[arg-type]
        opt.step()
    params = {_name(n): _full(p) for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _name(name: str) -> str:
    """A parameter's name in the plain model (without DDP's `module.`, RingAttention's `att.`)."""
    return name.removeprefix("module.").replace("att.att.", "att.")


def _compare(
    rank: int,
    world: int,
    make_model: Callable[[], nn.Module],
    ids: Tensor,
    targets: Tensor,
    steps: int,
) -> dict[str, dict[str, Any]]:
    """In each process: DDP, FSDP2 and the ring, one after the other."""
    return {
        how: train_steps(rank, world, make_model, ids, targets, how, steps=steps)
        for how in ("ddp", "fsdp", "ring")
    }


def compare_training(
    make_model: Callable[[], nn.Module],
    ids: Tensor,
    targets: Tensor,
    *,
    world: int = 2,
    steps: int = 2,
    timeout: float = 120.0,
) -> dict[str, dict[str, Any]]:
    """One process's steps against DDP, FSDP2 and the ring on `world` gloo processes (one spawn).

    Returns:
        By way (`"single"`, `"ddp"`, `"fsdp"`, `"ring"`): its `losses`, and beside the
        single process's, `grad_error` and `param_error`, the largest difference of any
        first-step gradient and of any parameter after the last step.
    """
    from attention.parallel.launch import spawn

    single = train_steps(0, 1, make_model, ids, targets, "single", steps=steps)
    ranks = spawn(_compare, world, make_model, ids, targets, steps, timeout=timeout)
    found: dict[str, dict[str, Any]] = {"single": {"losses": single["losses"]}}
    for how, run in ranks[0].items():
        found[how] = {"losses": run["losses"]}
        for key in ("grads", "params"):
            found[how][f"{key[:-1]}_error"] = max(
                float((run[key][name] - want).abs().max()) for name, want in single[key].items()
            )
    return found
