"""attention.lab.english: the shipped text, its vocabulary, the word-start score, the training."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest
import torch

from attention.lab.english import (
    PROBE_WINDOWS,
    TEXT_PATH,
    TEXT_SHA256,
    Characters,
    TextIntegrityError,
    clean_topics,
    english_text,
    split_text,
    train_english,
    word_start_score,
)
from attention.lab.heads import model_weights
from attention_site.stored import stored

TINY = {"steps": 6, "context_length": 16, "batch_size": 2, "emb_dim": 8, "n_heads": 2,
        "log_every": 3}  # fmt: skip


def test_the_shipped_text_is_plain_prose_and_checked() -> None:
    text = english_text()
    assert hashlib.sha256(TEXT_PATH.read_bytes()).hexdigest() == TEXT_SHA256
    assert 200_000 < len(text) < 400_000  # the brief's size: an excerpt, not the whole docs
    lines = text.splitlines()
    assert text.endswith("\n") and all(line.endswith(".") for line in lines)
    assert set(text) <= {"\n"} | {chr(c) for c in range(32, 127)}  # printable ASCII
    assert len(set(lines)) == len(lines)  # no paragraph twice
    licence = (TEXT_PATH.parent / "LICENSE-python-docs.txt").read_text(encoding="utf-8")
    assert TEXT_SHA256 in licence and "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in licence


def test_a_changed_or_missing_text_is_refused(tmp_path: Path) -> None:
    changed = tmp_path / "text.txt"
    changed.write_bytes(TEXT_PATH.read_bytes().replace(b"Python", b"Pithon", 1))
    with pytest.raises(TextIntegrityError, match="corrupt: expected sha256"):
        english_text(changed)
    with pytest.raises(TextIntegrityError, match="cannot be read"):
        english_text(tmp_path / "missing.txt")
    assert issubclass(TextIntegrityError, ValueError)


@pytest.mark.skipif(
    sys.version_info[:3] != (3, 11, 7), reason="the text was taken from Python 3.11.7's topics"
)
def test_the_text_is_clean_topics_of_python_3_11_7() -> None:
    import pydoc_data.topics

    assert clean_topics(pydoc_data.topics.topics) == english_text()


def test_clean_topics_keeps_prose_only() -> None:
    topic = "\n\n".join([
        "Heading\n*******",
        "A *block* is a piece of Python program\ntext that is executed as a unit.",
        "   >>> print('an example that is long enough to count as words')",
        "   x = f(*args, **kwargs) + [1, 2, 3] * {4: 5} - g(a, b, c, d, e, f, g)",
        "Too short to keep.",
        "The \u201cquoted\u201d words \u2014 and a dash \u2014 become **plain** ASCII text here.",
        "A *block* is a piece of Python program text that is executed as a unit.",
    ])  # fmt: skip
    assert clean_topics({"b": topic, "a": "Only in topic a, this sentence has eight words."}) == (
        "Only in topic a, this sentence has eight words.\n"
        "A block is a piece of Python program text that is executed as a unit.\n"
        'The "quoted" words - and a dash - become plain ASCII text here.\n'
    )
    with pytest.raises(TypeError, match="topics must map"):
        clean_topics({"a": 1})  # type: ignore[dict-item]


def test_split_holds_out_every_tenth_paragraph() -> None:
    text = "".join(f"line {k}.\n" for k in range(25))
    train, held = split_text(text)
    assert held == "line 9.\nline 19.\n"
    assert len(train.splitlines()) == 23 and "line 9." not in train
    with pytest.raises(ValueError, match="every must be >= 2"):
        split_text(text, every=1)
    with pytest.raises(TypeError, match="text must be a str"):
        split_text(b"a\n")  # type: ignore[arg-type]


def test_characters_round_trip_and_name_what_they_cannot_read() -> None:
    chars = Characters.of(english_text())
    sentence = 'The value of x is 3, as in (a) and [b]; see "doc".\n'
    assert chars.decode(chars.encode(sentence)[0]) == sentence
    assert chars.encode(sentence).shape == (1, len(sentence))
    with pytest.raises(ValueError, match="never saw: 'é'"):
        chars.encode("café")
    with pytest.raises(ValueError, match="distinct"):
        Characters("aa")
    with pytest.raises(ValueError, match="ids must be 1-d"):
        chars.decode(torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="ids"):
        chars.decode(torch.tensor([len(chars)]))  # outside the vocabulary


def test_word_start_score_reads_the_last_space() -> None:
    chars = Characters(" ab")
    idx = chars.encode(" ab ba b")  # spaces at 0, 3 and 6
    T = idx.shape[1]
    on_space = torch.zeros(T, T)
    last = [None, 0, 0, 0, 3, 3, 3, 6]  # the last space strictly before each query
    for t, s in enumerate(last):
        on_space[t, 0 if s is None else s] = 1.0
    previous = torch.eye(T).roll(-1, dims=1)  # each query reads the token before it
    weights = torch.stack([on_space, previous])[None]  # (batch 1, 2 heads, T, T)
    score = word_start_score(weights, idx, space=0)
    assert torch.allclose(score, torch.tensor([1.0, 3 / 7]))  # queries 1..7 have a space
    assert word_start_score(weights, chars.encode("abababab"), space=0).isnan().all()
    with pytest.raises(ValueError, match="same batch and T"):
        word_start_score(weights, idx[:, :4], space=0)


@pytest.mark.slow(seconds=2)
def test_training_is_seeded_and_logged() -> None:
    first, again = train_english(**TINY), train_english(**TINY)
    assert first.steps == [0, 3, 6]
    assert first.train_loss == again.train_loss and first.heldout_loss == again.heldout_loss
    pairs = zip(first.model.state_dict().values(), again.model.state_dict().values(), strict=True)
    for a, b in pairs:
        assert torch.equal(a, b)  # the same computation, one thread: the same floats
    other = train_english(**{**TINY, "seed": 1})
    assert other.heldout_loss != first.heldout_loss
    assert not first.model.training and first.batch_size == 2
    assert abs(first.train_loss[0] - math.log(len(first.chars))) < 0.5  # an untrained guess


@pytest.mark.slow(seconds=1)
def test_losses_on_the_logged_windows_are_the_logged_losses() -> None:
    run = train_english(**TINY)
    train, held = run.losses(PROBE_WINDOWS)
    assert train == pytest.approx(run.train_loss[-1], rel=1e-6)
    assert held == pytest.approx(run.heldout_loss[-1], rel=1e-6)
    assert run.losses(64) != (train, held)  # other windows, other means
    with pytest.raises(ValueError, match="count must be >= 1"):
        run.losses(0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"steps": 0}, ValueError, "steps must be >= 1"),
        ({"lr": 0.0}, ValueError, "lr must be a finite number > 0"),
        ({"lr": float("nan")}, ValueError, "lr must be a finite number > 0"),
        ({"lr": True}, ValueError, "lr must be a finite number > 0"),
        ({"emb_dim": 12, "n_heads": 4}, ValueError, "even width"),
        ({"batch_size": 2.0}, TypeError, "batch_size"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        train_english(**{**TINY, **kwargs})  # type: ignore[arg-type]


@pytest.mark.slow(seconds=1)
def test_a_diverging_training_says_so() -> None:
    with pytest.raises(FloatingPointError, match="diverged"):
        train_english(**{**TINY, "lr": 1e30})


@pytest.mark.heavy(seconds=7)  # where it is not stored yet; the tiny trainings above run in `tests`
def test_a_shorter_training_already_learns_english() -> None:
    """The site's run (chapter 15), 200 of its 500 steps: already far under the uniform guess
    ln V on paragraphs it never saw, and no better on the ones it trained on."""
    run = stored(train_english, seed=0, steps=200)
    uniform = math.log(len(run.chars))
    assert run.heldout_loss[-1] < 0.5 * uniform  # about 1.9 nats against ln 94 = 4.54
    assert abs(run.heldout_loss[-1] - run.train_loss[-1]) < 0.2  # it did not memorise
    weights = model_weights(run.model, run.encode("The value of the object is the name."))
    assert weights.shape == (2, 1, 4, 36, 36)
