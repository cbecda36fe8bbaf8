r"""Why attention: a GRU encoder-decoder with and without Bahdanau attention, on copying a sequence.

Before self-attention there was attention *between* two recurrent networks. A recurrent encoder
reads the input tokens $x_1, \dots, x_n$ one at a time, carrying a hidden state

$$
h_i = \operatorname{GRU}(x_i, h_{i-1}), \qquad h_0 = 0,
$$

and a recurrent decoder writes the output $y_1, \dots, y_m$ one token at a time from its own state
$s_t$. How the decoder learns about the input is the whole difference between the two models
here, which are otherwise the same network ([`Seq2Seq`][attention.lab.rnn.Seq2Seq]):

- **plain** (`attention=False`, Cho et al. / Sutskever et al., 2014): the decoder sees only the
  final encoder state, $c_t = h_n$ for every $t$. Everything about the input must squeeze through
  one fixed-size vector, however long the input is.
- **attention** (`attention=True`, Bahdanau, Cho and Bengio, 2014): at every step the decoder
  scores *all* encoder states against its previous state, turns the scores into weights and reads
  their weighted sum ([`AdditiveAttention`][attention.lab.rnn.AdditiveAttention]):

$$
\begin{aligned}
\omega_{t,i} &= v^\top \tanh(W s_{t-1} + U h_i), \\
\alpha_{t,i} &= \frac{\exp \omega_{t,i}}{\sum_{j=1}^{n} \exp \omega_{t,j}}, \\
c_t &= \sum_{i=1}^{n} \alpha_{t,i} h_i .
\end{aligned}
$$

Both decoders then run the same step,
$s_t = \operatorname{GRU}([\,y_{t-1}; c_t\,], s_{t-1})$ with $s_0 = h_n$, and predict
$p(y_t) = \operatorname{softmax}(W_o [\,s_t; c_t\,])$.

The experiment that compares them on copying a sequence is
[`attention.lab.copy_task`][attention.lab.copy_task].

Examples:
    >>> from attention.lab.copy_task import copy_batch
    >>> generator = torch.Generator().manual_seed(0)
    >>> src, tgt = copy_batch(batch_size=2, seq_len=5, vocab_size=20, generator=generator)
    >>> src.shape, tgt.shape  # (batch, seq_len) each
    (torch.Size([2, 5]), torch.Size([2, 5]))
    >>> bool((tgt == src).all())
    True
    >>> model = Seq2Seq(vocab_size=20, attention=True)
    >>> logits, alignments = model(src, decoder_inputs(tgt, bos=model.bos))
    >>> logits.shape, alignments.shape  # (batch, out_len, vocab), (batch, out_len, in_len)
    (torch.Size([2, 5, 20]), torch.Size([2, 5, 5]))
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.checks import check_flag, check_ids, check_size, check_tensor

__all__ = ["AdditiveAttention", "Seq2Seq", "decoder_inputs"]


def decoder_inputs(tgt: Tensor, bos: int) -> Tensor:
    """Teacher forcing: the decoder's inputs are the targets shifted right behind a start token.

    At step $t$ the decoder is fed the *true* previous token $y_{t-1}$ (with $y_0$ = `bos`)
    rather than its own guess, so every step of a training sequence is learned in parallel
    with the right history.

    Args:
        tgt: target ids, shape `(batch, out_len)`.
        bos: the start-of-sequence id (`Seq2Seq.bos`).

    Returns:
        Ids of shape `(batch, out_len)`: `[bos, y_1, ..., y_{m-1}]` per row.

    Examples:
        >>> decoder_inputs(torch.tensor([[3, 4, 5]]), bos=20)
        tensor([[20,  3,  4]])
    """
    check_ids(tgt, "tgt")
    check_tensor("tgt", tgt, ndim=2)
    check_size("bos", bos, minimum=0)
    start = torch.full_like(tgt[:, :1], bos)  # (B, 1)
    return torch.cat([start, tgt[:, :-1]], dim=1)  # (B, out_len)


class AdditiveAttention(nn.Module):
    r"""Bahdanau's additive attention: score every encoder state against the decoder's state.

    $$
    \begin{aligned}
    \omega_{t,i} &= v^\top \tanh(W s_{t-1} + U h_i), \\
    \alpha_t &= \operatorname{softmax}(\omega_t), \\
    c_t &= \sum_i \alpha_{t,i} h_i .
    \end{aligned}
    $$

    The score is a one-hidden-layer network of the query $s_{t-1}$ and the key $h_i$ (hence
    *additive*); the transformer's scaled dot product $q \cdot k / \sqrt{d_k}$ later replaced it
    with a cheaper one. $U h_i$ does not depend on $t$: compute it once per input with
    [`project_keys`][attention.lab.rnn.AdditiveAttention.project_keys].

    Args:
        hidden_size: size $H$ of both the decoder state $s$ and the encoder states $h_i$.

    Examples:
        >>> attn = AdditiveAttention(hidden_size=4)
        >>> enc_states, s_prev = torch.randn(2, 3, 4), torch.randn(2, 4)
        >>> context_vec, attn_weights = attn(s_prev, enc_states)
        >>> context_vec.shape, attn_weights.shape  # (batch, H), (batch, in_len)
        (torch.Size([2, 4]), torch.Size([2, 3]))
        >>> torch.allclose(attn_weights.sum(-1), torch.ones(2))
        True
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = check_size("hidden_size", hidden_size)
        self.W = nn.Linear(hidden_size, hidden_size, bias=False)
        self.U = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def project_keys(self, enc_states: Tensor) -> Tensor:
        """$U h_i$ for every encoder state, shape `(batch, in_len, H)`."""
        keys: Tensor = self.U(enc_states)  # (B, n, H)
        return keys

    def forward(
        self, s_prev: Tensor, enc_states: Tensor, keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """One decoder step's context vector and attention weights.

        Args:
            s_prev: the decoder's previous state $s_{t-1}$, shape `(batch, H)`.
            enc_states: the encoder states $h_1 \\dots h_n$, shape `(batch, in_len, H)`.
            keys: `project_keys(enc_states)` if already computed, else `None`.

        Returns:
            `(context_vec, attn_weights)`: $c_t$ of shape `(batch, H)` and $\\alpha_t$ of shape
            `(batch, in_len)`, each row summing to 1.

        Raises:
            ValueError: `s_prev` is not `(batch, H)`, `enc_states` not `(batch, in_len, H)`
                with the same batch and at least one state, or `keys` not of their shape.
        """
        H = self.hidden_size
        weight = self.W.weight
        check_tensor("enc_states", enc_states, like=weight)
        check_tensor("s_prev", s_prev, like=weight)
        if keys is not None:
            check_tensor("keys", keys, like=weight)
        if enc_states.ndim != 3 or enc_states.shape[-1] != H or enc_states.shape[1] == 0:
            raise ValueError(
                f"expected enc_states of shape (batch, in_len, H={H}) with in_len >= 1, "
                f"got {tuple(enc_states.shape)}"
            )
        if s_prev.shape != (enc_states.shape[0], H):
            raise ValueError(
                f"expected s_prev of shape (batch, H) = ({enc_states.shape[0]}, {H}), "
                f"got {tuple(s_prev.shape)}"
            )
        if keys is not None and keys.shape != enc_states.shape:
            raise ValueError(
                f"expected keys of the shape of enc_states {tuple(enc_states.shape)}, "
                f"got {tuple(keys.shape)}"
            )
        if keys is None:
            keys = self.project_keys(enc_states)  # (B, n, H)
        # omega_{t,i} = v^T tanh(W s_{t-1} + U h_i)
        attn_scores = self.v(torch.tanh(self.W(s_prev)[:, None, :] + keys))  # (B, n, 1)
        # alpha_t = softmax_i(omega_{t,i})
        attn_weights = torch.softmax(attn_scores.squeeze(-1), dim=-1)  # (B, n)
        # c_t = sum_i alpha_{t,i} h_i
        context_vec = (attn_weights[:, None, :] @ enc_states).squeeze(1)  # (B, H)
        return context_vec, attn_weights


class Seq2Seq(nn.Module):
    r"""A GRU encoder-decoder; with `attention=True` its decoder attends over all encoder states.

    Encoder: $h_i = \operatorname{GRU}(E_\text{src}[x_i], h_{i-1})$, $i = 1 \dots n$
    (`nn.GRU`, one fused loop). Decoder, one `nn.GRUCell` step per output token, $s_0 = h_n$,
    $y_0$ = `bos`:

    $$
    c_t = \begin{cases} h_n & \text{plain} \\ \sum_i \alpha_{t,i} h_i & \text{attention}
    \end{cases},
    $$

    $$
    \begin{aligned}
    s_t &= \operatorname{GRU}([\,E_\text{tgt}[y_{t-1}]; c_t\,], s_{t-1}), \\
    p(y_t) &= \operatorname{softmax}(W_o [\,s_t; c_t\,]).
    \end{aligned}
    $$

    The two variants share every other layer and size; the plain one simply has no
    [`AdditiveAttention`][attention.lab.rnn.AdditiveAttention] (and so slightly fewer parameters).

    Args:
        vocab_size: number of data tokens $V$; the decoder's start token is id $V$ (`bos`).
        embed_dim: size of the token embeddings.
        hidden_size: size $H$ of every recurrent state.
        attention: use Bahdanau attention (True) or the final encoder state only (False).

    Examples:
        >>> model = Seq2Seq(vocab_size=20, attention=False)
        >>> src = torch.tensor([[0, 1, 2]])  # "abc": (batch, in_len)
        >>> tokens, alignments = model.generate(src)
        >>> tokens.shape, alignments is None  # untrained, so the tokens are noise
        (torch.Size([1, 3]), True)
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 16, hidden_size: int = 32, attention: bool = True
    ) -> None:
        super().__init__()
        check_size("vocab_size", vocab_size, minimum=2)
        check_size("embed_dim", embed_dim)
        check_size("hidden_size", hidden_size)
        check_flag("attention", attention)
        self.vocab_size = vocab_size
        self.bos = vocab_size
        self.src_embed = nn.Embedding(vocab_size, embed_dim)
        self.encoder = nn.GRU(embed_dim, hidden_size, batch_first=True)
        self.tgt_embed = nn.Embedding(vocab_size + 1, embed_dim)  # + the start token
        self.cell = nn.GRUCell(embed_dim + hidden_size, hidden_size)
        self.attention = AdditiveAttention(hidden_size) if attention else None
        self.out = nn.Linear(2 * hidden_size, vocab_size)

    def _check_ids(self, name: str, ids: Tensor, bos: bool = False) -> None:
        """Ids must be a non-empty `(batch, length)` integer batch of known tokens."""
        top = self.vocab_size + 1 if bos else self.vocab_size  # the decoder also reads bos
        check_ids(ids, name, top, device=self.src_embed.weight.device)
        if ids.ndim != 2 or 0 in ids.shape:
            raise ValueError(
                f"expected {name} of shape (batch, length), both >= 1, got {tuple(ids.shape)}"
            )

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Run the encoder: all states $h_1 \\dots h_n$ and the final one $h_n$.

        Args:
            src: input ids, shape `(batch, in_len)`.

        Returns:
            `(enc_states, h_n)` of shapes `(batch, in_len, H)` and `(batch, H)`.
        """
        enc_states, h_n = self.encoder(self.src_embed(src.long()))  # (B, n, H), (1, B, H)
        return enc_states, h_n[0]  # (B, n, H), (B, H)

    def _decode(self, src: Tensor, tgt_in: Tensor | None, out_len: int) -> tuple[Tensor, Tensor]:
        """The decoder loop. Feeds `tgt_in` (teacher forcing) or, if None, its own argmax."""
        enc_states, h_n = self.encode(src)  # (B, n, H), (B, H)
        keys = self.attention.project_keys(enc_states) if self.attention else None  # (B, n, H)
        s = h_n  # s_0 = h_n: (B, H)
        context_vec = h_n  # the plain decoder's c_t, the same at every step: (B, H)
        if tgt_in is not None:  # teacher forcing: every input token is known, embed them at once
            y_embeds = self.tgt_embed(tgt_in.long())  # (B, m, E)
        else:
            y_embed = self.tgt_embed(torch.full_like(src[:, 0], self.bos))  # y_0: (B, E)
        outputs, alignments = [], []
        for t in range(out_len):
            if tgt_in is not None:
                y_embed = y_embeds[:, t]  # (B, E)
            if self.attention is not None:
                context_vec, attn_weights = self.attention(s, enc_states, keys)  # (B,H), (B,n)
                alignments.append(attn_weights)
            # s_t = GRU([y_{t-1}; c_t], s_{t-1})
            s = self.cell(torch.cat([y_embed, context_vec], dim=-1), s)  # (B, H)
            outputs.append(torch.cat([s, context_vec], dim=-1))  # [s_t; c_t]: (B, 2H)
            if tgt_in is None:  # greedy: feed back the model's own guess
                y_embed = self.tgt_embed(self.out(outputs[-1]).argmax(dim=-1))  # (B, E)
        logits = self.out(torch.stack(outputs, dim=1))  # W_o [s_t; c_t]: (B, m, V)
        weights = torch.stack(alignments, dim=1) if alignments else torch.empty(0)  # (B, m, n)
        return logits, weights

    def forward(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced decoding, as in training.

        Args:
            src: input ids, shape `(batch, in_len)`.
            tgt_in: decoder inputs `decoder_inputs(tgt, self.bos)`, shape `(batch, out_len)`.

        Returns:
            `(logits, alignments)`: shapes `(batch, out_len, vocab_size)` and, with attention,
            `(batch, out_len, in_len)` (row $t$ is $\\alpha_t$ and sums to 1); None without.

        Raises:
            ValueError: `src` or `tgt_in` is not a non-empty 2-D batch of ids in range, or
                their batches differ.
        """
        if src.ndim != 2 or tgt_in.ndim != 2 or src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                "expected src (batch, in_len) and tgt_in (batch, out_len) with the same batch, "
                f"got {tuple(src.shape)} and {tuple(tgt_in.shape)}"
            )
        self._check_ids("src", src)
        self._check_ids("tgt_in", tgt_in, bos=True)
        logits, weights = self._decode(src, tgt_in, tgt_in.shape[1])
        return logits, (weights if self.attention is not None else None)

    @torch.no_grad()
    def generate(self, src: Tensor, out_len: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Greedy decoding: each step is fed the model's own previous argmax.

        Args:
            src: input ids, shape `(batch, in_len)`.
            out_len: tokens to produce; default `in_len` (as the copy task needs).

        Returns:
            `(tokens, alignments)`: shapes `(batch, out_len)` and `(batch, out_len, in_len)`
            with attention, None without.

        Raises:
            ValueError: `src` is not a non-empty 2-D batch of ids in `0 .. vocab_size - 1`, or
                `out_len < 1`.
        """
        self._check_ids("src", src)
        out_len = src.shape[1] if out_len is None else check_size("out_len", out_len)
        logits, weights = self._decode(src, None, out_len)
        return logits.argmax(dim=-1), (weights if self.attention is not None else None)
