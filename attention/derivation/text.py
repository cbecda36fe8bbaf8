r"""From text to the `(batch, num_tokens, d_in)` tensor that attention consumes.

The pipeline a GPT runs before its first attention layer, as in the book's chapter 2:

1. **Tokenize**: text $\to$ token ids with GPT-2's byte-pair encoding
   ([`gpt2_encoding`][attention.derivation.text.gpt2_encoding]); a vocabulary of
   $V = 50{,}257$ tokens, of which `<|endoftext|>` $= 50256$ is the only special one.
2. **Batch**: a long text $\to$ (input, target) windows of `max_length` ids, the targets shifted
   by one token ([`sliding_windows`][attention.derivation.text.sliding_windows],
   [`GPTDatasetV1`][attention.derivation.text.GPTDatasetV1],
   [`create_dataloader_v1`][attention.derivation.text.create_dataloader_v1]).
3. **Embed**: ids $\to$ vectors, token embedding plus absolute position embedding
   ([`TokenAndPositionEmbedding`][attention.derivation.text.TokenAndPositionEmbedding]):

$$
\begin{gathered}
x^{(t)} = E_{\text{tok}}[\,\mathrm{id}_t\,] + E_{\text{pos}}[\,t\,], \\
E_{\text{tok}} \in \mathbb{R}^{V \times d_{in}},\;
E_{\text{pos}} \in \mathbb{R}^{\text{context\_length} \times d_{in}}.
\end{gathered}
$$

The BPE ranks ship with the package (`attention/data/gpt2.tiktoken`, MIT, from OpenAI's
whisper) and their sha256 is checked on load, so tokenizing never touches the network. The
encoding is built on first use, not on `import attention`.

Examples:
    >>> enc = gpt2_encoding()
    >>> ids = text_to_token_ids("Your journey starts with one step", enc)  # (1, 6)
    >>> ids
    tensor([[7120, 7002, 4940,  351,  530, 2239]])
    >>> _ = torch.manual_seed(123)
    >>> embedding = TokenAndPositionEmbedding(GPT2_VOCAB_SIZE, context_length=4, d_in=3)
    >>> inputs, targets = sliding_windows(ids[0], max_length=4, stride=1)
    >>> inputs  # (num_windows, max_length)
    tensor([[7120, 7002, 4940,  351],
            [7002, 4940,  351,  530]])
    >>> embedding(inputs).shape  # (batch, num_tokens, d_in)
    torch.Size([2, 4, 3])
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from attention.checks import check_ids, check_size

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "ENDOFTEXT",
    "GPT2_RANKS_PATH",
    "GPT2_RANKS_SHA256",
    "GPT2_VOCAB_SIZE",
    "GPTDatasetV1",
    "RanksIntegrityError",
    "TokenAndPositionEmbedding",
    "create_dataloader_v1",
    "gpt2_encoding",
    "load_gpt2_ranks",
    "sample_text",
    "sliding_windows",
    "text_to_token_ids",
    "token_ids_to_text",
]

DATA_DIR = Path(__file__).parent.parent / "data"  # attention/data

GPT2_RANKS_PATH: Path = DATA_DIR / "gpt2.tiktoken"
"""The shipped GPT-2 BPE ranks: one `<base64 token> <rank>` line per mergeable token."""

GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
"""The sha256 of `gpt2.tiktoken`; the hash tiktoken itself expects for these ranks."""

GPT2_VOCAB_SIZE = 50257
"""$V$: 50,256 byte-pair tokens plus `<|endoftext|>`."""

ENDOFTEXT = "<|endoftext|>"
"""GPT-2's one special token, id 50256: it separates unrelated texts."""

# GPT-2's pre-tokenizer, exactly as tiktoken_ext/openai_public.py writes it (r50k_pat_str): an
# equivalent, faster form of the original release's regex. BPE merges never cross these pieces.
GPT2_PAT_STR = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)


class RanksIntegrityError(ValueError):
    """The BPE ranks file is missing, or its bytes are not the expected ones."""


def load_gpt2_ranks(
    path: str | Path = GPT2_RANKS_PATH, expected_sha256: str = GPT2_RANKS_SHA256
) -> dict[bytes, int]:
    """Read BPE merge ranks from a local `.tiktoken` file after checking its sha256.

    The same parsing as tiktoken's `load_tiktoken_bpe`, on a local path only: no URL, no cache
    directory, no download. The hash is checked before a single line is parsed.

    Args:
        path: a `.tiktoken` file, one `<base64 token> <rank>` pair per line.
        expected_sha256: the hex sha256 the file's bytes must have.

    Returns:
        `{token_bytes: rank}`; for the shipped file, 50,256 entries with ranks `0..50255`.

    Raises:
        RanksIntegrityError: the file is missing or unreadable (a directory, say), or its
            sha256 differs; the message names the file and the expected (and actual) hash. A
            subclass of `ValueError`.

    Examples:
        >>> ranks = load_gpt2_ranks()
        >>> len(ranks), ranks[b"!"], ranks[b" the"]
        (50256, 0, 262)
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:  # missing, a directory, unreadable
        raise RanksIntegrityError(
            f"GPT-2 BPE ranks file {path} cannot be read ({error.strerror or error}): expected "
            f"a file with sha256 {expected_sha256}; reinstall the attention package"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise RanksIntegrityError(
            f"GPT-2 BPE ranks file {path} is corrupt: expected sha256 {expected_sha256}, "
            f"got {actual}; reinstall the attention package"
        )
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """GPT-2's tokenizer, built offline from the shipped ranks; cached after the first call.

    Equivalent to `tiktoken.get_encoding("gpt2")` (same ranks, regex and special token) without
    its download. Building it (hashing and parsing 50,256 ranks, importing tiktoken) costs tens
    of milliseconds, so it happens once, on first use, and never on `import attention`.

    Returns:
        A `tiktoken.Encoding` with `n_vocab == 50257` and `<|endoftext|>` $= 50256$. Its
        `encode` refuses special-token text unless allowed:
        `encode(text, allowed_special={"<|endoftext|>"})`.

    Raises:
        RanksIntegrityError: the shipped ranks are missing or corrupt.

    Examples:
        >>> enc = gpt2_encoding()
        >>> enc.n_vocab, enc.eot_token
        (50257, 50256)
        >>> enc.encode("Akwirw ier")  # an unknown word splits into known sub-word pieces
        [33901, 86, 343, 86, 220, 959]
        >>> [enc.decode([i]) for i in enc.encode("Akwirw ier")]
        ['Ak', 'w', 'ir', 'w', ' ', 'ier']
        >>> enc.encode("Hello <|endoftext|>", allowed_special={ENDOFTEXT})
        [15496, 220, 50256]
    """
    import tiktoken  # here, not at module level: keeps `import attention` fast

    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=load_gpt2_ranks(),
        special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def text_to_token_ids(text: str, tokenizer: tiktoken.Encoding | None = None) -> Tensor:
    """Encode `text` as a batch of one sequence of token ids, `<|endoftext|>` allowed.

    Args:
        text: any string.
        tokenizer: defaults to [`gpt2_encoding()`][attention.derivation.text.gpt2_encoding].

    Returns:
        Token ids, shape `(1, num_tokens)`, dtype `torch.long`.

    Examples:
        >>> text_to_token_ids("Every effort moves you")
        tensor([[6109, 3626, 6100,  345]])
    """
    token_ids = _encode(text, tokenizer or gpt2_encoding())
    return torch.tensor(token_ids, dtype=torch.long).unsqueeze(0)  # (1, num_tokens)


def _encode(text: object, tokenizer: object, name: str = "text") -> list[int]:
    """`tokenizer.encode(text)` with `<|endoftext|>` allowed, after checking both arguments."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    import tiktoken

    if not isinstance(tokenizer, tiktoken.Encoding):
        raise TypeError(
            f"tokenizer must be a tiktoken.Encoding (e.g. gpt2_encoding()), "
            f"got {type(tokenizer).__name__}"
        )
    token_ids: list[int] = tokenizer.encode(text, allowed_special={ENDOFTEXT})
    return token_ids


def token_ids_to_text(token_ids: Tensor, tokenizer: tiktoken.Encoding | None = None) -> str:
    """Decode one sequence of token ids, shape `(num_tokens,)` or `(1, num_tokens)`, to text.

    The inverse of [`text_to_token_ids`][attention.derivation.text.text_to_token_ids].

    Args:
        token_ids: ids, shape `(num_tokens,)` or `(1, num_tokens)`.
        tokenizer: defaults to [`gpt2_encoding()`][attention.derivation.text.gpt2_encoding].

    Returns:
        The decoded string.

    Raises:
        TypeError: `token_ids` is not an integer tensor.
        ValueError: `token_ids` holds more than one sequence, or an id outside the
            tokenizer's vocabulary `0 .. n_vocab - 1`.

    Examples:
        >>> token_ids_to_text(torch.tensor([[6109, 3626, 6100, 345]]))
        'Every effort moves you'
        >>> token_ids_to_text(torch.tensor([6109, -1]))
        Traceback (most recent call last):
        ...
        ValueError: token_ids must be in 0 .. 50256 (vocab_size=50257), got ids from -1 to 6109
    """
    tokenizer = tokenizer or gpt2_encoding()
    token_ids = check_ids(token_ids, "token_ids", tokenizer.n_vocab)
    if token_ids.ndim == 2 and token_ids.shape[0] == 1:
        token_ids = token_ids.squeeze(0)  # (num_tokens,)
    if token_ids.ndim != 1:
        raise ValueError(
            "expected token ids of shape (num_tokens,) or (1, num_tokens), "
            f"got shape {tuple(token_ids.shape)}"
        )
    return tokenizer.decode(token_ids.tolist())


def sliding_windows(
    token_ids: Sequence[int] | Tensor, max_length: int, stride: int
) -> tuple[Tensor, Tensor]:
    r"""Cut a long sequence of ids into (input, target) windows for next-token prediction.

    Window $k$ starts at $s_k = k \cdot \text{stride}$; its input is
    `token_ids[s_k : s_k + max_length]` and its target the same span shifted by one,
    `token_ids[s_k + 1 : s_k + max_length + 1]`, so `targets[k, t]` is the token that follows
    `inputs[k, t]`. `stride == max_length` gives windows that do not overlap; a smaller stride
    makes them overlap; a larger one skips `stride - max_length` tokens between windows.

    **The last partial window is dropped.** Only full windows are made (as the book's
    `GPTDatasetV1` does), so there are
    $\lfloor (n - \text{max\_length} - 1) / \text{stride} \rfloor + 1$ of them for $n$ ids, and
    the last $(n - \text{max\_length} - 1) \bmod \text{stride}$ ids, fewer than `stride`, appear in
    no window. With `stride <= max_length` every other id appears in some input or target.

    Args:
        token_ids: $n$ ids, a sequence of ints or a tensor of shape `(n,)`.
        max_length: tokens per window, $\ge 1$ (the `num_tokens` the model sees).
        stride: how far each window starts after the previous one, $\ge 1$.

    Returns:
        `(inputs, targets)`, each of shape `(num_windows, max_length)`, dtype `torch.long`.

    Raises:
        TypeError: `max_length` or `stride` not an int, or ids that are not integers (floats
            would be truncated silently).
        ValueError: `max_length` or `stride` below 1, `token_ids` not 1-d, or fewer than
            `max_length + 1` ids (not even one full window).

    Examples:
        >>> inputs, targets = sliding_windows(range(10), max_length=4, stride=4)
        >>> inputs
        tensor([[0, 1, 2, 3],
                [4, 5, 6, 7]])
        >>> targets  # shifted by one; id 9 is in no window: (10 - 4 - 1) % 4 = 1
        tensor([[1, 2, 3, 4],
                [5, 6, 7, 8]])
        >>> sliding_windows(range(10), max_length=4, stride=2)[0]  # overlapping
        tensor([[0, 1, 2, 3],
                [2, 3, 4, 5],
                [4, 5, 6, 7]])
    """
    check_size("max_length", max_length)
    check_size("stride", stride)
    ids = check_ids(token_ids).to(torch.long)  # (n,): floats refused, never truncated
    if ids.ndim != 1:
        raise ValueError(f"expected token ids of shape (n,), got shape {tuple(ids.shape)}")
    if ids.numel() < max_length + 1:
        raise ValueError(
            f"need at least max_length + 1 = {max_length + 1} token ids for one (input, target) "
            f"window, got {ids.numel()}"
        )
    windows = ids.unfold(0, max_length + 1, stride)  # (num_windows, max_length + 1)
    inputs = windows[:, :-1].contiguous()  # (num_windows, max_length)
    targets = windows[:, 1:].contiguous()  # (num_windows, max_length)
    return inputs, targets


class GPTDatasetV1(Dataset[tuple[Tensor, Tensor]]):
    """The book's next-token dataset: a text cut into (input, target) windows.

    Tokenizes `txt` (with `<|endoftext|>` allowed) and cuts it with
    [`sliding_windows`][attention.derivation.text.sliding_windows]; the last partial window is
    dropped.

    Args:
        txt: the training text.
        tokenizer: a `tiktoken.Encoding`, e.g.
            [`gpt2_encoding()`][attention.derivation.text.gpt2_encoding].
        max_length: tokens per window.
        stride: how far each window starts after the previous one.

    Attributes:
        input_ids: shape `(num_windows, max_length)`.
        target_ids: shape `(num_windows, max_length)`; `input_ids` shifted by one token.

    Examples:
        >>> dataset = GPTDatasetV1(sample_text(), gpt2_encoding(), max_length=4, stride=4)
        >>> inputs, targets = dataset[0]  # (max_length,) each
        >>> inputs, targets
        (tensor([ 2202, 11725, 46484,   198]), tensor([11725, 46484,   198,   198]))
        >>> token_ids_to_text(inputs)
        'On Reading Slowly\\n'
    """

    def __init__(
        self, txt: str, tokenizer: tiktoken.Encoding, max_length: int, stride: int
    ) -> None:
        token_ids = _encode(txt, tokenizer, name="txt")
        self.input_ids, self.target_ids = sliding_windows(token_ids, max_length, stride)

    def __len__(self) -> int:
        """The number of full windows."""
        return self.input_ids.shape[0]

    def __getitem__(self, idx: int) -> tuple[Tensor, Tensor]:
        """Window `idx` as `(input_ids, target_ids)`, each of shape `(max_length,)`."""
        return self.input_ids[idx], self.target_ids[idx]


def create_dataloader_v1(
    txt: str,
    batch_size: int = 4,
    max_length: int = 256,
    stride: int = 128,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int = 0,
    tokenizer: tiktoken.Encoding | None = None,
) -> DataLoader[tuple[Tensor, Tensor]]:
    """The book's data loader: batches of (input, target) windows of a text.

    Args:
        txt: the training text.
        batch_size: windows per batch.
        max_length: tokens per window.
        stride: how far each window starts after the previous one.
        shuffle: shuffle the windows each epoch (seed with `torch.manual_seed`).
        drop_last: drop a last batch smaller than `batch_size`.
        num_workers: worker processes for loading.
        tokenizer: defaults to [`gpt2_encoding()`][attention.derivation.text.gpt2_encoding].

    Returns:
        A `DataLoader` over [`GPTDatasetV1`][attention.derivation.text.GPTDatasetV1] yielding
        `(inputs, targets)`, each of shape `(batch_size, max_length)`.

    Examples:
        >>> loader = create_dataloader_v1(
        ...     sample_text(), batch_size=8, max_length=4, stride=4, shuffle=False
        ... )
        >>> inputs, targets = next(iter(loader))
        >>> inputs.shape, targets.shape  # (batch_size, max_length)
        (torch.Size([8, 4]), torch.Size([8, 4]))
        >>> torch.equal(inputs[1:, 0], targets[:-1, -1])  # stride 4 = max_length: no gaps
        True
    """
    dataset = GPTDatasetV1(txt, tokenizer or gpt2_encoding(), max_length, stride)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
    )


class TokenAndPositionEmbedding(nn.Module):
    r"""Token ids to input vectors: token embedding plus absolute position embedding.

    $$
    \begin{gathered}
    x^{(t)} = E_{\text{tok}}[\,\mathrm{id}_t\,] + E_{\text{pos}}[\,t\,], \\
    t = 0, \dots, \text{num\_tokens} - 1,
    \end{gathered}
    $$

    as in GPT-2 and the book: the same token gets the same $E_{\text{tok}}$ row wherever it
    occurs, and the position row tells attention where it is. The position embedding is shared
    by every sequence of the batch.

    Args:
        vocab_size: $V$, the number of token ids, e.g.
            [`GPT2_VOCAB_SIZE`][attention.derivation.text.GPT2_VOCAB_SIZE].
        context_length: the longest sequence supported; rows of $E_{\text{pos}}$.
        d_in: width of each embedding, the `d_in` of the attention layers.

    Attributes:
        tok_emb: `nn.Embedding(vocab_size, d_in)`, $E_{\text{tok}}$; created first, so under
            the same seed it equals the book's `nn.Embedding(vocab_size, d_in)`.
        pos_emb: `nn.Embedding(context_length, d_in)`, $E_{\text{pos}}$; created second.

    Examples:
        >>> _ = torch.manual_seed(123)
        >>> embedding = TokenAndPositionEmbedding(GPT2_VOCAB_SIZE, context_length=4, d_in=256)
        >>> token_ids = torch.tensor([[40, 367, 2885, 1464], [1807, 3619, 402, 271]])
        >>> embedding(token_ids).shape  # (batch, num_tokens) -> (batch, num_tokens, d_in)
        torch.Size([2, 4, 256])
    """

    def __init__(self, vocab_size: int, context_length: int, d_in: int) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("context_length", context_length),
            ("d_in", d_in),
        ):
            check_size(name, value)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.d_in = d_in
        self.tok_emb = nn.Embedding(vocab_size, d_in)
        self.pos_emb = nn.Embedding(context_length, d_in)

    def forward(self, token_ids: Tensor) -> Tensor:
        """Embed `token_ids` of shape `(batch, num_tokens)`; returns `(batch, num_tokens, d_in)`.

        Raises:
            TypeError: `token_ids` is not an integer tensor.
            ValueError: `token_ids` is not 2-d, has more than `context_length` tokens, or
                holds an id outside `0 .. vocab_size - 1`.
        """
        check_ids(token_ids, "token_ids", self.vocab_size, device=self.tok_emb.weight.device)
        if token_ids.ndim != 2:
            raise ValueError(
                "expected token ids of shape (batch, num_tokens), "
                f"got a {token_ids.ndim}-d tensor of shape {tuple(token_ids.shape)}"
            )
        num_tokens = token_ids.shape[1]
        if num_tokens > self.context_length:
            raise ValueError(
                f"sequence of {num_tokens} tokens is longer than "
                f"context_length={self.context_length}"
            )
        tok_embeds: Tensor = self.tok_emb(token_ids.long())  # (batch, num_tokens, d_in)
        positions = torch.arange(num_tokens, device=token_ids.device)  # (num_tokens,)
        pos_embeds: Tensor = self.pos_emb(positions)  # (num_tokens, d_in)
        return tok_embeds + pos_embeds  # (batch, num_tokens, d_in), broadcast over batch

    def extra_repr(self) -> str:
        """Shown by `print(module)`."""
        return (
            f"vocab_size={self.vocab_size}, context_length={self.context_length}, d_in={self.d_in}"
        )


@functools.cache
def sample_text() -> str:
    """The shipped sample text: "On Reading Slowly", a short essay written for this project.

    About 2.9 KB of plain English (about 650 GPT-2 tokens), used by the examples and docs pages
    for tokenizing and sliding windows. Original to this project, under its MIT license; nothing
    is downloaded.

    Returns:
        The text, starting with its title line.

    Examples:
        >>> text = sample_text()
        >>> text.splitlines()[0]
        'On Reading Slowly'
        >>> len(gpt2_encoding().encode(text)) > 500
        True
    """
    return (DATA_DIR / "sample.txt").read_text(encoding="utf-8")
