r"""Chapter 15's trained model: a character-level GPT that reads English, trained in seconds.

The text is plain English prose that ships with the package: the paragraphs of the Python
documentation's topics (`pydoc_data.topics`, the texts `help()` shows for them, such as
`help("assert")`, under the PSF licence beside it in `attention/data/`), taken once from
Python 3.11.7 by [`clean_topics`][attention.lab.english.clean_topics] and committed, because
the topics differ from one Python version to the next.
[`english_text`][attention.lab.english.english_text] checks its sha256 on load, as the GPT-2
ranks are checked.

The model is the book's [`GPTModel`][attention.model.gpt.GPTModel] with one token per
character (the $V$ characters of the text, [`Characters`][attention.lab.english.Characters])
and RoPE positions. [`train_english`][attention.lab.english.train_english] trains it on
windows of the text and logs its loss on the training text and on held-out paragraphs
(every tenth, [`split_text`][attention.lab.english.split_text]), in nats per character: a
model that knows nothing guesses uniformly and scores $\ln V$.

Examples:
    >>> text = english_text()
    >>> text.splitlines()[0][:30]
    'These equivalences assume that'
    >>> chars = Characters.of(text)
    >>> len(chars)  # V: the characters of the text, the line break included
    94
    >>> ids = chars.encode("A class.")  # (1, 8): one id per character
    >>> chars.decode(ids[0])
    'A class.'
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from attention.checks import check_ids, check_positive, check_size
from attention.lab.threads import torch_threads
from attention.model.gpt import GPTModel

__all__ = [
    "PROBE_WINDOWS",
    "TEXT_PATH",
    "TEXT_SHA256",
    "Characters",
    "EnglishRun",
    "TextIntegrityError",
    "clean_topics",
    "english_text",
    "split_text",
    "train_english",
    "word_start_score",
]

TEXT_PATH: Path = Path(__file__).parent.parent / "data" / "python-docs-topics.txt"
"""The shipped text: one paragraph a line, from Python 3.11.7's `pydoc_data.topics`."""

TEXT_SHA256 = "bcb1d18044dd240cca0f8e0455683af7c3a55b087bdf9301991859f0aa6947c3"
"""The sha256 of `python-docs-topics.txt`, checked before the text is read."""

_TYPOGRAPHY = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "-",
    "\u2026": "...",
}


class TextIntegrityError(ValueError):
    """The shipped text is missing, or its bytes are not the expected ones."""


def _prose(paragraph: str) -> str | None:
    """One paragraph of the topics as one line of plain prose, or None for anything else: a
    heading (underlined), an example (`>>>`), a table or grammar (mostly symbols), a short
    line, non-ASCII text."""
    lines = paragraph.splitlines()
    if not lines or (len(lines) > 1 and set(lines[-1].strip()) <= set("=-*~^")):
        return None  # empty, or a heading over its underline
    if any(line.lstrip().startswith((">>>", "...")) for line in lines):
        return None  # an interactive example
    text = " ".join(line.strip() for line in lines).removeprefix("* ")  # a list item's text
    for fancy, plain in _TYPOGRAPHY.items():
        text = text.replace(fancy, plain)
    text = re.sub(r"(?<![\w*])\*{1,2}([A-Za-z_][^*]*?)\*{1,2}(?![\w*])", r"\1", text)
    text = re.sub(r" +", " ", text)
    letters = sum(c.isalpha() or c == " " for c in text)
    if not text.isascii() or len(text.split()) < 8 or not text.endswith("."):
        return None
    return text if letters >= 0.85 * len(text) else None  # not code, a table, a grammar


def clean_topics(topics: Mapping[str, str]) -> str:
    """The plain prose of the documentation's topics: how `python-docs-topics.txt` was made.

    Every paragraph (text between blank lines) of every topic, in the topics' sorted order,
    that reads as prose: a sentence of at least 8 words ending in a full stop, in ASCII once
    curly quotes and dashes are made plain, mostly letters and spaces (not code, a table or
    a grammar rule), no heading and no interactive example. Its lines are joined into one,
    runs of spaces become one, `*emphasis*` and `**strong**` lose their stars; a paragraph
    seen before is left out.

    Args:
        topics: topic name -> text, as `pydoc_data.topics.topics`.

    Returns:
        One paragraph a line, each line ending in a line break.

    Raises:
        TypeError: `topics` is not a mapping of strings to strings.

    Examples:
        >>> topic = ("Title\\n*****\\n\\nA *block* is a piece of Python program text\\n"
        ...          "that is executed as a unit.\\n\\n   x = 1\\n")
        >>> clean_topics({"execmodel": topic})
        'A block is a piece of Python program text that is executed as a unit.\\n'
    """
    if not isinstance(topics, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in topics.items()
    ):
        raise TypeError(f"topics must map topic names to their text, got {topics!r:.60}")
    kept: dict[str, None] = {}  # ordered, without repeats
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            text = _prose(paragraph)
            if text is not None:
                kept.setdefault(text)
    return "".join(f"{text}\n" for text in kept)


@functools.cache
def english_text(path: Path = TEXT_PATH, expected_sha256: str = TEXT_SHA256) -> str:
    """The shipped English text, after checking its sha256; read once.

    Args:
        path: the text file.
        expected_sha256: the hex sha256 its bytes must have.

    Returns:
        About 220 KB of English, one paragraph a line.

    Raises:
        TextIntegrityError: the file is missing or unreadable, or its sha256 differs; the
            message names the file and both hashes. A subclass of `ValueError`.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TextIntegrityError(
            f"text file {path} cannot be read ({error.strerror or error}): expected a file "
            f"with sha256 {expected_sha256}; reinstall the attention package"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise TextIntegrityError(
            f"text file {path} is corrupt: expected sha256 {expected_sha256}, got {actual}"
        )
    return data.decode("ascii")


def split_text(text: str, every: int = 10) -> tuple[str, str]:
    """`(training, held_out)`: every `every`-th paragraph (line) is held out, the rest trains.

    Held-out paragraphs come from every part of the text, so they read like the rest; the
    model never trains on them.

    Args:
        text: one paragraph a line.
        every: hold out paragraphs `every - 1`, `2 * every - 1`, ...; at least 2.

    Examples:
        >>> split_text("a\\nb\\nc\\nd\\n", every=2)
        ('a\\nc\\n', 'b\\nd\\n')
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    check_size("every", every, minimum=2)
    lines = text.splitlines(keepends=True)
    held = [line for k, line in enumerate(lines) if k % every == every - 1]
    kept = [line for k, line in enumerate(lines) if k % every != every - 1]
    return "".join(kept), "".join(held)


@dataclass(frozen=True)
class Characters:
    """A character vocabulary: token `i` is the character `chars[i]`.

    Args:
        chars: the characters, distinct, in id order.
    """

    chars: str

    def __post_init__(self) -> None:
        if not isinstance(self.chars, str) or not self.chars:
            raise ValueError(f"chars must be a non-empty str, got {self.chars!r:.60}")
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("chars must be distinct characters")

    @classmethod
    def of(cls, text: str) -> Characters:
        """The vocabulary of `text`: its distinct characters, sorted."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"text must be a non-empty str, got {text!r:.60}")
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> Tensor:
        """`text` as ids, `(1, len(text))`.

        Raises:
            ValueError: a character of `text` is not in the vocabulary (named in the message).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        index = {c: i for i, c in enumerate(self.chars)}
        missing = [c for c in text if c not in index]
        if missing:
            raise ValueError(f"text has a character the model never saw: {missing[0]!r}")
        return torch.tensor([[index[c] for c in text]], dtype=torch.long)  # (1, T)

    def decode(self, ids: Tensor) -> str:
        """The text of a 1-d tensor of ids."""
        ids = check_ids(ids, "ids", len(self.chars))
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-d, got shape {tuple(ids.shape)}")
        return "".join(self.chars[i] for i in ids.tolist())


@dataclass
class EnglishRun:
    """A character-level GPT trained on the shipped English, and its logged losses.

    Attributes:
        model: the trained `GPTModel`, in eval mode.
        chars: its vocabulary.
        steps: the training steps at which the losses were logged.
        train_loss: mean cross-entropy (nats per character) on fixed windows of the
            training text, at those steps.
        heldout_loss: the same on windows of the held-out paragraphs.
        batch_size: windows of `model.context_length` characters per training step.
        seconds: wall time of the training.
    """

    model: GPTModel
    chars: Characters
    batch_size: int = 1
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    heldout_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def encode(self, text: str) -> Tensor:
        """`text` as the model's ids, `(1, len(text))`; an unknown character raises."""
        return self.chars.encode(text)

    def decode(self, ids: Tensor) -> str:
        """The text of a 1-d tensor of the model's ids."""
        return self.chars.decode(ids)

    def losses(self, count: int) -> tuple[float, float]:
        """The model's mean loss on `count` windows spread evenly over each part of the text.

        The logged losses use `PROBE_WINDOWS` windows a part; more windows tell how much of
        a gap between the two parts is the choice of windows.

        Returns:
            `(training, held_out)`, in nats per character.
        """
        check_size("count", count)
        parts = (self.chars.encode(part)[0] for part in split_text(english_text()))
        train, held = (
            _loss(self.model, _windows(ids, self.model.context_length, count)) for ids in parts
        )
        return train, held


def word_start_score(weights: Tensor, idx: Tensor, space: int) -> Tensor:
    r"""Each head's mean weight on the last space before the query: where its word starts.

    For query $t$, the key is the latest $s < t$ with $x_s$ a space; queries with no space
    before them are left out. A head that reads the start of the current word scores near 1
    (with the previous-token score, the other thing a character-level head can do without
    knowing any word: see chapter 16).

    Args:
        weights: `(..., batch, heads, T, T)` attention weights.
        idx: the ids they were computed from, `(batch, T)`.
        space: the id of the space character.

    Returns:
        `(..., heads)`. NaN if no query has a space before it.

    Examples:
        >>> idx = torch.tensor([[0, 1, 2, 0, 1]])  # 0 is the space: " ab a"
        >>> back = torch.zeros(5, 5)
        >>> back[1:3, 0] = back[3, 0] = back[4, 3] = 1.0  # each query reads the last space
        >>> back[0, 0] = 1.0  # query 0 has no space before it: not scored
        >>> word_start_score(back[None, None], idx, space=0)
        tensor([1.])
    """
    check_ids(idx, "idx")
    if (
        weights.ndim < 4
        or idx.shape != (weights.shape[-4], weights.shape[-1])
        or (weights.shape[-1] != weights.shape[-2])
    ):
        raise ValueError(
            f"weights must be (..., batch, heads, T, T) and idx (batch, T) of "
            f"the same batch and T, got {tuple(weights.shape)} and "
            f"{tuple(idx.shape)}"
        )
    num_tokens = idx.shape[1]
    at = torch.where(idx == space, torch.arange(num_tokens), -1)  # (b, T): the space's place
    last = torch.cat([at.new_full((idx.shape[0], 1), -1), at[:, :-1]], 1).cummax(1).values
    has = last >= 0  # (b, T): queries with a space before them
    if not bool(has.any()):
        return torch.full(weights.shape[:-4] + weights.shape[-3:-2], float("nan"))
    index = last.clamp(min=0)[:, None, :, None].expand(*weights.shape[-4:-1], 1)
    on = weights.gather(-1, index.expand(*weights.shape[:-1], 1))[..., 0]  # (..., b, h, T)
    return on.transpose(-3, -2)[..., has].mean(-1)  # (..., h)


PROBE_WINDOWS = 32
"""How many fixed windows of each part of the text `train_english` logs its losses on."""


def _windows(ids: Tensor, length: int, count: int) -> Tensor:
    """`count` windows of `length + 1` ids spread evenly over `ids`: `(count, length + 1)`."""
    starts = torch.linspace(0, len(ids) - length - 1, count).long()
    return torch.stack([ids[s : s + length + 1] for s in starts.tolist()])


def _loss(model: GPTModel, windows: Tensor) -> float:
    """Mean cross-entropy of predicting each window's next ids, in eval mode, no gradients."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(windows[:, :-1])  # (b, T, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
    model.train(was_training)
    return float(loss)


def train_english(
    seed: int = 0,
    steps: int = 500,
    context_length: int = 64,
    batch_size: int = 16,
    emb_dim: int = 64,
    n_heads: int = 4,
    n_layers: int = 2,
    lr: float = 8e-3,
    log_every: int = 50,
    num_threads: int | None = 1,
) -> EnglishRun:
    """Train a character-level GPT on the shipped English text; log its losses as it goes.

    Each step draws `batch_size` windows of `context_length + 1` characters at random from
    the training paragraphs and lowers the cross-entropy of every next character (AdamW,
    weight decay 0.01; the learning rate rises over 30 steps, then falls along a cosine to a
    tenth). Every `log_every` steps, and at the end, the loss on `PROBE_WINDOWS` fixed windows
    of each part is logged. `seed` fixes the weights and the windows, and on one thread the same
    arguments give the same model.

    Args:
        seed: seeds the weights and the data.
        steps: optimizer steps.
        context_length: characters per window, and the model's context.
        batch_size: windows per step.
        emb_dim: the model's width.
        n_heads: heads per layer.
        n_layers: transformer blocks.
        lr: AdamW's peak learning rate.
        log_every: log the losses every this many steps.
        num_threads: torch intra-op threads while training (restored afterwards), or None to
            leave them as they are.

    Returns:
        The [`EnglishRun`][attention.lab.english.EnglishRun], its model in eval mode.

    Raises:
        TypeError: a size is not an int.
        ValueError: a size below 1, `emb_dim` not divisible by `n_heads` into an even head
            width (RoPE), or `lr` not a finite number above 0.
        FloatingPointError: the loss stopped being finite (lr too large).
    """
    for name, value in (
        ("steps", steps),
        ("context_length", context_length),
        ("batch_size", batch_size),
        ("emb_dim", emb_dim),
        ("n_heads", n_heads),
        ("n_layers", n_layers),
        ("log_every", log_every),
    ):
        check_size(name, value)
    check_size("seed", seed, minimum=0)
    if emb_dim % n_heads or (emb_dim // n_heads) % 2:
        raise ValueError(
            f"emb_dim must split into n_heads heads of an even width (RoPE), "
            f"got emb_dim={emb_dim}, n_heads={n_heads}"
        )
    lr = check_positive("lr", lr)
    text = english_text()
    chars = Characters.of(text)
    train_ids, held_ids = (chars.encode(part)[0] for part in split_text(text))
    cfg = {
        "vocab_size": len(chars),
        "context_length": context_length,
        "emb_dim": emb_dim,
        "n_heads": n_heads,
        "n_layers": n_layers,
        "drop_rate": 0.0,
        "qkv_bias": False,
        "rope_base": 10000.0,
    }
    torch.manual_seed(seed)
    run = EnglishRun(GPTModel(cfg), chars, batch_size)
    probes = [_windows(ids, context_length, PROBE_WINDOWS) for ids in (train_ids, held_ids)]
    with torch_threads(num_threads):
        start = time.perf_counter()
        _train(run, train_ids, probes, steps, lr, log_every, seed)
        run.seconds = time.perf_counter() - start
    run.model.eval()
    return run


def _train(
    run: EnglishRun,
    ids: Tensor,
    probes: list[Tensor],
    steps: int,
    lr: float,
    log_every: int,
    seed: int,
) -> None:
    """The loop of `train_english`: AdamW on random windows of `ids`, the losses logged."""
    model, length = run.model, run.model.context_length
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min((step + 1) / 30, 0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))),
    )
    data = torch.Generator().manual_seed(seed)
    offsets = torch.arange(length + 1)  # (T + 1,)
    model.train()
    for step in range(steps + 1):
        if step % log_every == 0 or step == steps:
            run.steps.append(step)
            run.train_loss.append(_loss(model, probes[0]))
            run.heldout_loss.append(_loss(model, probes[1]))
        if step == steps:
            break
        starts = torch.randint(len(ids) - length - 1, (run.batch_size, 1), generator=data)
        windows = ids[starts + offsets]  # (b, T + 1)
        logits = model(windows[:, :-1])  # (b, T, V)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"training diverged at step {step}: loss {loss.item()} "
                f"(lr={lr!r}); try a smaller lr"
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
