"""attention.lab.training: the task's data, the tiny model, the head scores, and the page's training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attention.lab.threads import torch_threads
from attention.lab.training import (
    TinyAttentionModel,
    first_token_weight,
    head_weights,
    previous_and_first,
    previous_token_weight,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "multihead.md"
V = T = 8  # the page's letters and sequence length
STEPS, BATCH, LR = 200, 64, 0.01  # the page's loop: range(STEPS + 1), Adam


def test_the_page_trains_as_this_file_does() -> None:
    """The numbers below are the page's: a change there must be made here too."""
    text = PAGE.read_text(encoding="utf-8")
    assert "V, T = 8, 8" in text
    model = r"TinyAttentionModel\(vocab_size=V, context_length=T, d_model=16,\s+num_heads=2\)"
    assert re.search(model, text)  # wrapped to the page's column
    assert f"torch.optim.Adam(model.parameters(), lr={LR})" in text
    assert f"for step in range({STEPS + 1}):" in text
    assert re.search(rf"previous_and_first\({BATCH}, T, V, generator=data\)", text)


def train(seed: int, num_heads: int = 2) -> tuple[TinyAttentionModel, float]:
    """The page's loop under `seed` (weights and data); the model and its last loss."""
    torch.manual_seed(seed)
    model = TinyAttentionModel(vocab_size=V, context_length=T, d_model=16, num_heads=num_heads)
    data = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    with torch_threads(1):
        for _ in range(STEPS + 1):
            idx, targets = previous_and_first(BATCH, T, V, generator=data)
            logits = model(idx)[:, 1:]
            loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model, loss.item()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.slow(seconds=1)
def test_training_splits_the_work_between_the_heads(seed: int) -> None:
    model, loss = train(seed)
    fresh, _ = previous_and_first(256, T, V, generator=torch.Generator().manual_seed(1))
    weights = head_weights(model, fresh)  # (256, 2, T, T)
    prev, first = previous_token_weight(weights), first_token_weight(weights)
    prev_head, first_head = int(prev.argmax()), int(first.argmax())
    assert prev_head != first_head
    assert prev[prev_head] > 0.5 and first[first_head] > 0.5  # the page's claims
    assert prev[prev_head] > 0.9 and first[first_head] > 0.9  # with a wide margin
    assert loss < 0.05  # from ln 8 = 2.08


def test_previous_and_first_is_what_it_says() -> None:
    idx, targets = previous_and_first(16, 6, 5, generator=torch.Generator().manual_seed(3))
    assert idx.shape == (16, 6) and targets.shape == (16, 5, 2)
    assert idx.dtype == targets.dtype == torch.int64
    assert int(idx.min()) >= 0 and int(idx.max()) < 5
    for t in range(1, 6):  # query t: the previous token, the first token
        assert torch.equal(targets[:, t - 1, 0], idx[:, t - 1])
        assert torch.equal(targets[:, t - 1, 1], idx[:, 0])
    again, _ = previous_and_first(16, 6, 5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(idx, again)  # the same seed, the same batch
    targets[0, 0, 0] = 99  # targets are a tensor of their own
    assert int(idx.max()) < 5


def test_scores_of_known_patterns() -> None:
    back = torch.eye(5).roll(-1, dims=1)  # query t reads key t - 1 (row 0 reads key 4)
    to_first = torch.zeros(5, 5)
    to_first[:, 0] = 1.0
    even = torch.tril(torch.ones(5, 5))
    even = even / even.sum(-1, keepdim=True)  # query t: 1 / (t + 1) on each key
    weights = torch.stack([back, to_first, even])[None]  # (1, 3 heads, 5, 5)
    expected = sum(1 / (t + 1) for t in range(2, 5)) / 3
    torch.testing.assert_close(previous_token_weight(weights), torch.tensor([1.0, 0.0, expected]))
    torch.testing.assert_close(first_token_weight(weights), torch.tensor([0.0, 1.0, expected]))


def test_head_weights_match_the_module() -> None:
    torch.manual_seed(0)
    model = TinyAttentionModel(vocab_size=V, context_length=T)
    idx, _ = previous_and_first(3, T, V, generator=torch.Generator().manual_seed(0))
    weights = head_weights(model, idx)
    _, expected = model.attention(model.embedding(idx), need_weights=True)
    assert not weights.requires_grad
    torch.testing.assert_close(weights, expected.detach())
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, T))


def test_torch_threads_restores_the_setting() -> None:
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda: previous_and_first(0, 8, 8), ValueError, "batch_size"),
        (lambda: previous_and_first(4, 1, 8), ValueError, "num_tokens"),
        (lambda: previous_and_first(4, 8, 1), ValueError, "vocab_size"),
        (lambda: previous_and_first(4, 8.0, 8), TypeError, "num_tokens"),
        (lambda: previous_and_first(4, 8, 8, generator=0), TypeError, "generator"),
        (lambda: TinyAttentionModel(8, 8, d_model=15, num_heads=2), ValueError, "num_heads"),
        (lambda: TinyAttentionModel(8, 8, num_outputs=0), ValueError, "num_outputs"),
        (lambda: TinyAttentionModel(0, 8), ValueError, "vocab_size"),
        (lambda: head_weights(torch.nn.Linear(2, 2), torch.zeros(1, 2)), TypeError, "model"),
        (lambda: head_weights(TinyAttentionModel(8, 8), torch.zeros(1, 2)), TypeError, "idx"),
        (lambda: previous_token_weight(torch.zeros(2, 4, 4)), ValueError, "weights"),
        (lambda: first_token_weight(torch.zeros(1, 2, 2, 2)), ValueError, "weights"),
        (lambda: first_token_weight(torch.zeros(1, 2, 4, 3)), ValueError, "weights"),
        (lambda: previous_token_weight([[0.0]]), TypeError, "weights"),
        (lambda: torch_threads(0).__enter__(), ValueError, "num_threads"),
    ],
)
def test_bad_arguments_are_named(call: object, error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        call()  # type: ignore[operator]
