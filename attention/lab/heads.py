r"""What trained heads do: attention patterns of a GPT, two head scores, an induction head.

Every head of a [`GPTModel`][attention.model.gpt.GPTModel] computes, for one sequence,

$$
\begin{aligned}
S &= \frac{Q K^\top}{\sqrt{d_h}} \in \mathbb{R}^{T \times T}, \\
\alpha &= \operatorname{softmax}(S + M),
\end{aligned}
$$

with $M$ the causal mask (and window). [`model_scores`][attention.lab.heads.model_scores]
returns $S$ for every layer and head, [`model_weights`][attention.lab.heads.model_weights]
returns $\alpha$. Two numbers say what a head does with them:

- its **previous-token score**, the weight each query puts on the token just before it,
  $\frac{1}{T-1}\sum_{t=1}^{T-1} \alpha_{t,\,t-1}$;
- its **induction score**, over the queries $t$ whose token $x_t$ occurred before, the weight
  on the tokens that *followed* an earlier occurrence,
  $\sum_{s \le t,\; x_{s-1} = x_t} \alpha_{t,s}$, averaged over those queries. A head that
  scores near 1 finds "the last time this token appeared" and looks at what came next: the
  *induction head* of Elhage et al. (2021), measured across models by Olsson et al. (2022),
  which lets a model continue a sequence it has seen.

[`train_induction`][attention.lab.heads.train_induction] trains a small GPT on random tokens
repeated twice, the task on which such heads form, in tens of seconds on a CPU.

Examples:
    >>> _ = torch.manual_seed(0)
    >>> cfg = {"vocab_size": 20, "context_length": 8, "emb_dim": 16, "n_heads": 2,
    ...        "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}
    >>> model = GPTModel(cfg).eval()
    >>> idx = repeated_tokens(3, 4, vocab_size=20)  # (batch, 2n): n tokens, then again
    >>> bool((idx[:, :4] == idx[:, 4:]).all())
    True
    >>> weights = model_weights(model, idx)  # (n_layers, batch, n_heads, T, T)
    >>> weights.shape
    torch.Size([2, 3, 2, 8, 8])
    >>> bool(torch.allclose(weights.sum(-1), torch.ones(2, 3, 2, 8)))  # rows sum to 1
    True
    >>> induction_score(weights, idx).shape  # (n_layers, n_heads)
    torch.Size([2, 2])
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attention.checks import check_ids, check_input, check_positive, check_size, check_tensor
from attention.derivation.core import causal_mask
from attention.derivation.text import gpt2_encoding, sample_text
from attention.lab.threads import torch_threads
from attention.layer.multihead import MultiHeadAttention
from attention.model.gpt import GPTModel, TransformerBlock

__all__ = [
    "InductionRun",
    "ablate_head",
    "induction_score",
    "layer_scores",
    "model_scores",
    "model_weights",
    "previous_token_score",
    "repeated_tokens",
    "train_induction",
]

_TWO_LAYERS = {"n_layers": 2, "drop_rate": 0.0, "qkv_bias": False, "rope_base": 10000.0}
"""The induction model's fixed settings: two layers with RoPE, no dropout, no biases."""


def _blocks(model: GPTModel) -> list[TransformerBlock]:
    if not isinstance(model, GPTModel):
        raise TypeError(f"model must be a GPTModel, got {type(model).__name__}")
    return model.blocks


def layer_scores(att: MultiHeadAttention, x: Tensor) -> Tensor:
    r"""Every query head's scores $Q K^\top$ times the scale ($1 / \sqrt{d_h}$), unmasked:
    the same projection and rotation as the forward
    ([`project`][attention.layer.multihead.MultiHeadAttention.project]).

    Args:
        att: the layer.
        x: its input, `(batch, num_tokens, d_in)`.

    Returns:
        `(batch, num_heads, num_tokens, num_tokens)`.
    """
    check_input(x, att.d_in, att.context_length, batched=True, like=att.W_query.weight)
    queries, keys, _ = att.project(x)  # (b, h, T, d_h), (b, h_kv, T, d_h)
    keys = keys.repeat_interleave(att.num_heads // att.num_kv_heads, dim=1)  # (b, h, T, d_h)
    scale = 1 / math.sqrt(att.head_dim) if att.scale is None else att.scale
    return queries @ keys.transpose(-2, -1) * scale  # (b, h, T, T)


def model_scores(model: GPTModel, idx: Tensor, document_ids: Tensor | None = None) -> Tensor:
    r"""The scaled scores $S = QK^\top/\sqrt{d_h}$ of every layer and head, before any mask.

    Runs `model` on `idx` once (no gradients), keeps the input each block's attention
    received (a pre-hook on the attention module: the model calls it in every block), and
    asks that attention for its scores
    ([`layer_scores`][attention.lab.heads.layer_scores]: the forward's own projection and
    rotation).

    Args:
        model: a `GPTModel` (any configuration: grouped heads, RoPE, window).
        idx: token ids `(batch, num_tokens)`.
        document_ids: optional `(batch, num_tokens)` ids of packed documents (the model's
            `document_ids`): each layer's input is then the documents' own.

    Returns:
        `(n_layers, batch, n_heads, num_tokens, num_tokens)`, float32 or the model's dtype;
        entry `[l, b, h, i, j]` is query $i$'s score for key $j$ (also for $j > i$, which the
        causal mask hides).

    Raises:
        TypeError: `model` is not a `GPTModel`.
        ValueError: `idx` is not `(batch, num_tokens)` ids of the model's vocabulary.
    """
    blocks = _blocks(model)
    check_ids(idx, "idx", model.vocab_size, device=model.tok_emb.weight.device)
    if idx.ndim != 2:
        raise ValueError(f"idx must be (batch, num_tokens), got {tuple(idx.shape)}")
    inputs: list[Tensor] = []  # what each block's attention reads

    def keep(att: nn.Module, args: tuple[Tensor, ...]) -> None:
        inputs.append(args[0])  # (b, T, emb_dim)

    hooks = [block.att.register_forward_pre_hook(keep) for block in blocks]
    try:
        with torch.no_grad():
            model(idx, document_ids=document_ids)
            scores = [layer_scores(block.att, x) for block, x in zip(blocks, inputs, strict=True)]
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(scores)  # (n_layers, b, h, T, T)


def model_weights(model: GPTModel, idx: Tensor, document_ids: Tensor | None = None) -> Tensor:
    r"""The weights $\alpha = \operatorname{softmax}(S + M)$ of every layer and head.

    From the model's own forward
    ([`attention_weights`][attention.model.gpt.GPTModel.attention_weights]): each layer's mask,
    score modifiers and sinks, exactly as it computes.

    Args:
        model: a `GPTModel`.
        idx: token ids `(batch, num_tokens)`.
        document_ids: optional `(batch, num_tokens)` ids of packed documents: $M$ also hides
            every key of another document.

    Returns:
        `(n_layers, batch, n_heads, num_tokens, num_tokens)`; each row sums to 1 (less with
        a sink logit), and is 0 above the diagonal (and beyond a window).
    """
    _blocks(model)  # a GPTModel
    return model.attention_weights(idx, document_ids=document_ids)


def _check_weights(weights: Tensor) -> None:
    check_tensor("weights", weights)
    if weights.ndim < 4 or weights.shape[-1] != weights.shape[-2] or weights.shape[-1] < 2:
        raise ValueError(
            "weights must be (..., batch, heads, T, T) with T >= 2, "
            f"got shape {tuple(weights.shape)}"
        )


def previous_token_score(weights: Tensor) -> Tensor:
    r"""Each head's mean weight on the previous token, $\frac{1}{T-1}\sum_{t \ge 1} \alpha_{t,t-1}$.

    Args:
        weights: `(..., batch, heads, T, T)` attention weights, `T >= 2`.

    Returns:
        `(..., heads)`, averaged over the batch: 1 for a head that always looks one back,
        about $\frac{1}{t+1}$ on average for a head that spreads evenly.

    Examples:
        >>> back = torch.eye(4).roll(-1, dims=1)  # query t reads key t - 1 (row 0 reads 3)
        >>> previous_token_score(back[None, None])  # (batch 1, head 1, 4, 4) -> (1,)
        tensor([1.])
    """
    _check_weights(weights)
    one_back = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # alpha[t, t-1]: (..., b, h, T-1)
    return one_back.mean(dim=(-3, -1))  # (..., h)


def induction_score(weights: Tensor, idx: Tensor) -> Tensor:
    r"""Each head's weight on "what followed this token before", over the queries that can.

    For query $t$, the induction keys are the $s \le t$ with $x_{s-1} = x_t$; the score is
    $\sum_{s} \alpha_{t,s}$ over them, averaged over every query that has one (a token seen
    before), in every sequence of the batch.

    Args:
        weights: `(..., batch, heads, T, T)` attention weights, `T >= 2`.
        idx: the token ids they were computed from, `(batch, T)`.

    Returns:
        `(..., heads)`. NaN if no token of `idx` repeats (there is nothing to score).

    Examples:
        >>> idx = torch.tensor([[5, 6, 7, 5, 6, 7]])  # "5 6 7" twice
        >>> ideal = torch.zeros(6, 6)
        >>> ideal[3, 1] = ideal[4, 2] = ideal[5, 3] = 1.0  # each reads what followed it before
        >>> ideal[:3, 0] = 1.0  # the first half has nothing to look up
        >>> induction_score(ideal[None, None], idx)  # (batch 1, head 1, 6, 6) -> (1,)
        tensor([1.])
    """
    _check_weights(weights)
    check_ids(idx, "idx")
    num_tokens = weights.shape[-1]
    if idx.shape != (weights.shape[-4], num_tokens):
        raise ValueError(
            f"idx must be (batch, T) = {(weights.shape[-4], num_tokens)} to match weights, "
            f"got {tuple(idx.shape)}"
        )
    # after[b, t, s]: key s follows an earlier occurrence of query t's token (x_{s-1} = x_t)
    previous = torch.cat([idx.new_full((idx.shape[0], 1), -1), idx[:, :-1]], dim=1)  # x_{s-1}
    after = idx[:, :, None] == previous[:, None, :]  # (b, T, T)
    after &= causal_mask(num_tokens, idx.device)  # s <= t
    has = after.any(-1)  # (b, T): queries whose token was seen before
    if not bool(has.any()):
        return torch.full(weights.shape[:-4] + weights.shape[-3:-2], float("nan"))
    on_after = (weights * after[:, None].to(weights.dtype)).sum(-1)  # (..., b, h, T)
    per_query = on_after.transpose(-3, -2)[..., has]  # (..., h, queries that can)
    return per_query.mean(-1)  # (..., h)


@contextmanager
def ablate_head(model: GPTModel, layer: int, head: int) -> Iterator[None]:
    """Inside the `with` block, one head of one layer writes nothing: its context vectors are 0.

    The head's slice of the concatenated heads is zeroed before `out_proj`, so the layer's
    output lacks exactly that head's contribution (`out_proj`'s bias stays).

    Args:
        model: a `GPTModel`.
        layer: the block, `0 .. n_layers - 1`.
        head: the query head, `0 .. n_heads - 1`.

    Examples:
        >>> cfg = {"vocab_size": 9, "context_length": 4, "emb_dim": 8, "n_heads": 2,
        ...        "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}
        >>> model = GPTModel(cfg).eval()
        >>> idx = torch.tensor([[1, 2, 3]])
        >>> with ablate_head(model, layer=0, head=1):
        ...     ablated = model(idx)
        >>> bool(torch.allclose(ablated, model(idx)))  # the head mattered; restored after
        False
    """
    blocks = _blocks(model)
    check_size("layer", layer, minimum=0)
    check_size("head", head, minimum=0)
    if layer >= len(blocks) or head >= blocks[0].att.num_heads:
        raise ValueError(
            f"layer must be < {len(blocks)} and head < {blocks[0].att.num_heads}, "
            f"got layer={layer}, head={head}"
        )
    att = blocks[layer].att
    span = slice(head * att.head_dim, (head + 1) * att.head_dim)

    def zero(out_proj: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor]:
        heads = args[0].clone()  # (b, T, h * d_h): the heads side by side
        heads[..., span] = 0.0
        return (heads,)

    hook = att.out_proj.register_forward_pre_hook(zero)
    try:
        yield
    finally:
        hook.remove()


def repeated_tokens(
    batch_size: int,
    n: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Random token ids, then the same ids again: `(batch_size, 2 * n)`.

    The first half cannot be predicted; the second half can, by copying from the first.
    """
    check_size("batch_size", batch_size)
    check_size("n", n)
    check_size("vocab_size", vocab_size)
    half = torch.randint(vocab_size, (batch_size, n), generator=generator)  # (b, n)
    return torch.cat([half, half], dim=1)  # (b, 2n)


@dataclass
class InductionRun:
    """A GPT trained on repeated random tokens, and what was logged while it trained.

    Attributes:
        model: the trained `GPTModel`, in eval mode.
        vocab: its vocabulary as GPT-2 token ids: model token `i` is GPT-2 token `vocab[i]`
            (every distinct token of the sample essay, so the essay can be fed to it).
        n: the length of each random half.
        steps: the training steps at which the logs were taken.
        loss_first: cross-entropy on the first, random half at those steps.
        loss_repeated: cross-entropy on the repeated half.
        induction: the best induction score among the last layer's heads.
        previous_token: the best previous-token score among the first layer's heads.
        seconds: wall time of the training.
    """

    model: GPTModel
    vocab: Tensor
    n: int
    steps: list[int] = field(default_factory=list)
    loss_first: list[float] = field(default_factory=list)
    loss_repeated: list[float] = field(default_factory=list)
    induction: list[float] = field(default_factory=list)
    previous_token: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def periods(self) -> tuple[int, int]:
        """The shortest and the longest period of the sequences it was trained on."""
        return _periods(self.n)

    def encode(self, text: str) -> Tensor:
        """`text` as the model's token ids, `(1, num_tokens)`.

        Raises:
            ValueError: a token of `text` is not in the model's vocabulary.
        """
        gpt2_ids = torch.tensor(gpt2_encoding().encode(text))
        found = torch.isin(gpt2_ids, self.vocab)
        if not bool(found.all()):
            missing = gpt2_encoding().decode([int(gpt2_ids[~found][0])])
            raise ValueError(f"text has a token the model never saw: {missing!r}")
        return torch.searchsorted(self.vocab, gpt2_ids)[None]  # (1, T)

    def labels(self, idx: Tensor) -> list[str]:
        """The text of each of the model's token ids in a 1-d `idx`, for axis labels."""
        return [gpt2_encoding().decode([int(self.vocab[i])]) for i in idx.tolist()]


def train_induction(
    seed: int = 0,
    steps: int = 700,
    n: int = 16,
    batch_size: int = 32,
    emb_dim: int = 64,
    n_heads: int = 4,
    lr: float = 3e-3,
    log_every: int = 25,
    num_threads: int | None = 1,
    context_length: int | None = None,
) -> InductionRun:
    """Train a two-layer GPT to continue random tokens that repeat, until an induction head forms.

    The vocabulary is the sample essay's distinct tokens. Each training sequence is `m`
    random tokens repeated until it is `2 * n` long, with the period `m` drawn between `n / 2`
    and `n` for every sequence, so an earlier copy cannot be found by its distance alone. The
    model uses RoPE (rotary positions, relative by construction). The losses and scores are
    logged on the plain task, `n` random tokens then the same `n`
    ([`repeated_tokens`][attention.lab.heads.repeated_tokens]): the loss on the second half falls
    from $\\ln V$ to near 0 once a last-layer head looks up the token after the current
    token's earlier occurrence, with the help of a first-layer head that reads the previous
    token. AdamW, no dropout; `seed` fixes the weights and the data.

    Args:
        seed: seeds the weights and the data.
        steps: optimizer steps.
        n: length of the random half, at least 2; the model's context is `2 * n`.
        batch_size: sequences per step.
        emb_dim: the model's width.
        n_heads: heads per layer.
        lr: AdamW's learning rate.
        log_every: log the losses and the scores every this many steps.
        num_threads: torch intra-op threads while training (restored afterwards), or None to
            leave the setting: the model is small enough that one thread is fastest.
        context_length: the longest sequence the trained model takes, at least `2 * n` (the
            default); with rotary positions nothing is learned per position, so it may
            exceed what training showed it, and it changes no weight.

    Returns:
        An [`InductionRun`][attention.lab.heads.InductionRun].

    Raises:
        ValueError: a size below 1 (`n` below 2), `context_length` below `2 * n`, or `lr`
            not a finite number above 0.
        FloatingPointError: the loss stopped being finite (the learning rate is too large).
    """
    sizes = {
        "steps": steps,
        "n": n,
        "batch_size": batch_size,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        "log_every": log_every,
    }
    for name, value in sizes.items():
        check_size(name, value, minimum=2 if name == "n" else 1)  # n = 1: no period to draw
    check_positive("lr", lr)
    vocab = torch.unique(torch.tensor(gpt2_encoding().encode(sample_text())))  # sorted ids
    context_length = 2 * n if context_length is None else context_length
    check_size("context_length", context_length, minimum=2 * n)
    cfg = {
        "vocab_size": len(vocab),
        "context_length": context_length,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        **_TWO_LAYERS,
    }
    torch.manual_seed(seed)
    model = GPTModel(cfg)
    run = InductionRun(model, vocab, n)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    data = torch.Generator().manual_seed(seed)
    probe = repeated_tokens(64, n, len(vocab), torch.Generator().manual_seed(seed + 1))
    start = time.perf_counter()
    with torch_threads(num_threads):
        for step in range(steps + 1):
            if step % log_every == 0 or step == steps:
                model.eval()
                _log(run, step, probe)
                model.train()
            if step == steps:
                break
            idx = _periodic(batch_size, n, len(vocab), data)  # (b, 2n)
            logits = model(idx[:, :-1])  # token t + 1 from tokens 0..t: (b, 2n - 1, V)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"training diverged at step {step}: loss {loss.item()} "
                    f"(lr={lr!r}); try a smaller lr"
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    run.seconds = time.perf_counter() - start
    model.eval()
    return run


def _periods(n: int) -> tuple[int, int]:
    """The periods `m` a training sequence of `2n` tokens repeats with: `n // 2` to `n`."""
    return n // 2, n


def _periodic(batch_size: int, n: int, vocab_size: int, generator: torch.Generator) -> Tensor:
    """`2n` tokens: `m` random ones, repeated until `2n`, with the period `m` drawn in `n/2..n`.

    With one fixed period a head could find the earlier copy by position alone ("look
    `n - 1` back"); a period that varies leaves only the content to match: induction.
    """
    shortest, longest = _periods(n)
    periods = torch.randint(shortest, longest + 1, (batch_size,), generator=generator)  # (b,)
    pattern = torch.randint(vocab_size, (batch_size, n), generator=generator)  # (b, n)
    positions = torch.arange(2 * n) % periods[:, None]  # t mod m: (b, 2n)
    return pattern.gather(1, positions)  # x_t = x_{t mod m}: (b, 2n)


def _log(run: InductionRun, step: int, probe: Tensor) -> None:
    n = run.n
    with torch.no_grad():
        logits = run.model(probe[:, :-1])  # (b, 2n - 1, V)
        losses = nn.functional.cross_entropy(
            logits.transpose(1, 2), probe[:, 1:], reduction="none"
        )  # (b, 2n - 1): loss of predicting token t + 1
    weights = model_weights(run.model, probe)  # (L, b, h, T, T)
    run.steps.append(step)
    run.loss_first.append(float(losses[:, : n - 1].mean()))  # targets 1..n-1: random
    run.loss_repeated.append(float(losses[:, n:].mean()))  # targets n+1..2n-1: copies
    run.induction.append(float(induction_score(weights[-1], probe).max()))
    run.previous_token.append(float(previous_token_score(weights[0]).max()))
