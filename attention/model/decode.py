r"""Decode with static shapes: a step that one CUDA graph can hold.

A decode step runs one token through every block. For GPT-2 124M that is a few hundred
small kernels; on a GPU each launch costs microseconds of the host's time, more than the
kernel itself, so the step is **launch-bound** (the weights it reads, 247 MB in float16, take
about 50 µs at an H200's 4.8 TB/s). A `torch.cuda.CUDAGraph` records the launches once and
replays them with one call, but only a step whose shapes, memory and control flow never
change, and that never waits for the device, can be recorded.

The usual step (the dynamic one) reads the cache's live slots, so its shapes grow by one
key a step, and finds slots from host integers. The **static step** (gpt-fast's):

- each block's [`KVCache`][attention.layer.cache.KVCache], inside its
  [`static_steps`][attention.layer.cache.KVCache.static_steps], writes the new key and value
  at the slot its position gives and returns **every** slot with each slot's position (the
  same update as a dynamic step's, so the two mix freely on the same caches);
  the layer's mask, evaluated at the positions on the device, hides the empty ones (a
  position below 0 is never visible), so the kernel sees `(b, h_kv, slots, d_h)` at every
  step;
- each row's position is the cache's own `next`, a device tensor, read at the step's start
  and advanced by the update; the model's own `logits` takes it, for the position embedding
  and RoPE's angles;
- nothing is read on the host and no Python branch depends on a value.

It is the model's own computation ([`GPTModel.logits`][attention.model.gpt.GPTModel.logits]
with `positions=`), through each block's forward, so its result is the model's. On CUDA it
is recorded once per generation, after one step that warms the kernels up, and replayed for
every later step. Sampling stays outside the
graph: the same code chooses the next token from the same logits, so a seeded generator
draws the same tokens.

On the CPU the dynamic step stays the default (a CPU launch costs little and the static step
reads every slot); `generate(..., static=True)` runs the static step there, as the tests do.

Examples:
    >>> from attention.model.gpt import GPTModel
    >>> cfg = {"vocab_size": 50, "context_length": 16, "emb_dim": 16, "n_heads": 2,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> _ = torch.manual_seed(0)
    >>> model = GPTModel(cfg).eval()
    >>> ids = torch.randint(0, 50, (1, 6))
    >>> caches = model.init_caches(batch_size=1)
    >>> _ = model(ids[:, :5], caches)  # the prefill: tokens 0..4
    >>> step = StaticDecode(model, caches)
    >>> logits = step(ids[:, 5:])  # token 5, over all 16 slots: (1, vocab)
    >>> torch.allclose(logits, model(ids)[:, -1], atol=1e-5)
    True
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor

from attention.checks import check_ids
from attention.layer.cache import KVCache
from attention.layer.multihead import MultiHeadAttention
from attention.model.gpt import GPTModel

__all__ = ["StaticDecode", "supports_static"]


def supports_static(model: GPTModel) -> bool:
    """Whether `model`'s decode can take the static step: every layer softmax attention, and
    none needing the explicit path.

    A linear layer's state has no static step (its update is not a slot written). A score
    modifier without an additive form (a soft cap) goes to FlexAttention on CUDA, which
    compiles and plans on the host: such a model keeps the dynamic step there.
    """
    if not all(isinstance(block.att, MultiHeadAttention) for block in model.blocks):
        return False  # a linear layer's state (GatedDeltaNet) has no static step
    on_cuda = model.tok_emb.weight.device.type == "cuda"
    return not (on_cuda and any(block.att.spec.explicit_only for block in model.blocks))


class StaticDecode:
    """The decode steps after a prefill, with static shapes; on CUDA, replayed from one graph.

    Args:
        model: the `GPTModel` whose `caches` the prefill filled.
        caches: its caches (one per block), all holding the same tokens.
        graph: record the step in a CUDA graph (default: on CUDA).

    Calling it with the next token of every row `(b, 1)` returns the logits after it
    `(b, vocab_size)` and advances every cache's `length`; the caller stops before a linear
    cache is full. On a graph, the logits are the graph's output buffer: read them before the
    next call. A hook on a block runs when the step is recorded, not at each replay.
    """

    def __init__(self, model: GPTModel, caches: list[KVCache], graph: bool | None = None) -> None:
        first = caches[0]
        device = first.keys.device
        self.model, self.caches = model, caches
        self.token = torch.zeros(first.batch_size, 1, dtype=torch.long, device=device)
        self.graph_on = device.type == "cuda" if graph is None else graph
        self.steps = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._logits: Tensor | None = None

    def step(self) -> Tensor:
        """One token per row (`self.token`) through the model: `(b, vocab_size)` logits."""
        with ExitStack() as stack:
            for cache in self.caches:
                stack.enter_context(cache.static_steps())
            positions = self.caches[0].next[:, None].clone()  # (b, 1): each row's next
            return self.model.logits(self.token, self.caches, positions=positions)[:, -1]

    def __call__(self, token: Tensor) -> Tensor:
        first, model = self.caches[0], self.model
        if model.pos_emb is not None and first.length >= model.context_length:
            limit = model.context_length
            raise ValueError(
                f"the caches hold {first.length} tokens: a model with learned "
                f"positions takes at most context_length={limit}"
            )
        self._check_token(token)
        self.token.copy_(token)
        if not self.graph_on:
            logits = self.step()  # each cache's update counts the token
        elif self.steps == 0:  # warm up off the capture: kernels chosen, tables made
            logits = self._warm_up()
        else:
            if self._graph is None:  # recording runs the Python (counting), not the step
                self._graph, self._logits = self._record()
            else:  # a replay runs no Python: the host's count, for the layers' checks
                for cache in self.caches:
                    cache.length += 1
            self._graph.replay()
            assert self._logits is not None
            logits = self._logits
        self.steps += 1
        return logits

    def _check_token(self, token: object) -> None:
        """`(batch_size, 1)` integer ids, each in the vocabulary (read where that costs no
        wait for a device: on the CPU); `copy_` would broadcast a `(1, 1)` to every row and
        truncate float ids silently."""
        want = tuple(self.token.shape)
        if not (
            isinstance(token, Tensor)
            and tuple(token.shape) == want
            and not token.is_floating_point()
            and not token.is_complex()
            and token.dtype != torch.bool
        ):
            got = (
                f"{token.dtype} {tuple(token.shape)}"
                if isinstance(token, Tensor)
                else type(token).__name__
            )
            raise ValueError(
                f"token must be integer ids of shape (batch_size, 1) = {want}, "
                f"one per row, got {got}"
            )
        embedding = getattr(self.model, "tok_emb", None)
        if token.device.type == "cpu" and isinstance(embedding, torch.nn.Embedding):
            check_ids(token, "token", embedding.num_embeddings)

    def _warm_up(self) -> Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self.step()
        torch.cuda.current_stream().wait_stream(side)
        return logits

    def _record(self) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        """Record one step (recording runs nothing: the first replay is this step)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.step()
        return graph, logits
