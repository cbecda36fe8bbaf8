"""attention.lab.heads: scores and weights of every head, the two head scores, ablation, training."""

from __future__ import annotations

import math

import pytest
import torch

from attention.lab.heads import (
    _periodic,
    ablate_head,
    induction_score,
    model_scores,
    model_weights,
    previous_token_score,
    repeated_tokens,
    train_induction,
)
from attention.model.gpt import GPTModel
from attention_site.stored import stored

CFG = {"vocab_size": 30, "context_length": 12, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.0, "qkv_bias": True}  # fmt: skip


def model_for(**extra: object) -> GPTModel:
    torch.manual_seed(0)
    return GPTModel({**CFG, **extra}).double().eval()


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"n_kv_heads": 2},
        {"rope_base": 100.0},
        {"window": 3},
        {"n_kv_heads": 1, "rope_base": 1e4},
        {"rope_base": 1e4, "window": 3, "sinks": 1},
    ],
)
def test_weights_equal_the_modules_own_explicit_path(extra: dict[str, object]) -> None:
    model = model_for(**extra)
    idx = torch.randint(30, (2, 10), generator=torch.Generator().manual_seed(1))
    inputs: list[torch.Tensor] = []
    # what each block's attention reads: its norm1's output
    hooks = [b.norm1.register_forward_hook(lambda m, a, out: inputs.append(out))  # type: ignore[union-attr]
             for b in model.trf_blocks]  # fmt: skip
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    weights = model_weights(model, idx)  # (L, b, h, T, T)
    assert weights.shape == (2, 2, 4, 10, 10) and len(inputs) == 2
    for layer, x in enumerate(inputs):
        with torch.no_grad():
            _, expected = model.trf_blocks[layer].att(x, need_weights=True)  # type: ignore[operator]
        torch.testing.assert_close(weights[layer], expected, atol=1e-12, rtol=0)
    scores = model_scores(model, idx)
    assert torch.isfinite(scores).all()  # also above the diagonal: no mask in the scores


def test_rows_sum_to_one_and_nothing_is_read_from_the_future() -> None:
    weights = model_weights(model_for(), torch.randint(30, (3, 12)))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4, 12, dtype=torch.float64))
    assert (weights.triu(1) == 0).all()


def test_previous_token_score_of_known_patterns() -> None:
    T = 8
    back = torch.zeros(T, T)
    back[0, 0] = 1.0
    back[torch.arange(1, T), torch.arange(T - 1)] = 1.0  # query t reads key t - 1
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    both = torch.stack([back, uniform])[None]  # (batch 1, 2 heads, T, T)
    scores = previous_token_score(both)
    expected_uniform = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)
    torch.testing.assert_close(scores, torch.tensor([1.0, expected_uniform]))


def test_induction_score_of_known_patterns() -> None:
    n = 5
    idx = repeated_tokens(2, n, vocab_size=1000, generator=torch.Generator().manual_seed(0))
    assert len(set(idx[0, :n].tolist())) == n  # no repeat inside a half, for this seed
    T = 2 * n
    ideal = torch.zeros(T, T)
    ideal[:n, 0] = 1.0
    ideal[torch.arange(n, T), torch.arange(1, n + 1)] = 1.0  # t reads t - n + 1
    current = torch.eye(T)  # every query reads itself: no induction
    heads = torch.stack([ideal, current]).expand(2, 2, T, T)  # (batch 2, 2 heads, T, T)
    torch.testing.assert_close(induction_score(heads, idx), torch.tensor([1.0, 0.0]))
    # a layer axis in front is kept: (L, b, h, T, T) -> (L, h)
    assert induction_score(heads.expand(3, 2, 2, T, T), idx).shape == (3, 2)


def test_induction_score_without_repeats_is_nan_and_shapes_are_checked() -> None:
    weights = torch.eye(4)[None, None]
    assert torch.isnan(induction_score(weights, torch.tensor([[1, 2, 3, 4]]))).all()
    with pytest.raises(ValueError, match=r"idx must be \(batch, T\) = \(1, 4\)"):
        induction_score(weights, torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="weights must be"):
        previous_token_score(torch.ones(4, 4))
    with pytest.raises(ValueError, match="T >= 2"):
        previous_token_score(torch.ones(1, 1, 1, 1))


def test_ablating_a_head_removes_exactly_its_slice() -> None:
    model = model_for()
    idx = torch.randint(30, (2, 6))
    before = model(idx)
    att = model.trf_blocks[1].att
    seen: list[torch.Tensor] = []
    with ablate_head(model, layer=1, head=2):  # its hook runs first, then ours sees the result
        hook = att.out_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0]))  # type: ignore[union-attr]
        ablated = model(idx)
        hook.remove()
    d_h = att.head_dim  # type: ignore[union-attr]
    assert (seen[0][..., 2 * d_h : 3 * d_h] == 0).all()
    assert not torch.allclose(ablated, before)
    torch.testing.assert_close(model(idx), before)  # the hook is gone
    with pytest.raises(ValueError, match="layer must be < 2 and head < 4, got layer=2"):
        with ablate_head(model, layer=2, head=0):
            pass


def test_periodic_training_data_repeats_with_its_own_period() -> None:
    idx = _periodic(64, 8, 50, torch.Generator().manual_seed(0))
    assert idx.shape == (64, 16)
    periods = set()
    for row in idx:
        m = next(m for m in range(4, 9) if torch.equal(row[m:], row[:-m]))
        periods.add(m)
    assert periods == set(range(4, 9))  # every period from n/2 to n occurs


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="model must be a GPTModel"):
        model_scores(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idx"):
        model_scores(model_for(), torch.tensor([[30]]))  # outside the vocabulary
    with pytest.raises(ValueError, match="steps"):
        train_induction(steps=0)
    with pytest.raises(ValueError, match=r"lr must be a finite number > 0, got -1\.0"):
        train_induction(lr=-1.0)
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got inf"):
        train_induction(lr=float("inf"))
    with pytest.raises(ValueError, match="n must be >= 2, got 1"):
        train_induction(n=1)  # no period to draw between n / 2 and n
    with pytest.raises(
        FloatingPointError, match=r"training diverged at step \d+: loss nan \(lr=1e\+30\)"
    ):
        train_induction(lr=1e30, steps=5, n=4, batch_size=2, emb_dim=8, n_heads=2, log_every=5)


@pytest.mark.heavy(seconds=24)  # each seed, on one core, where it is not stored yet
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_induction_head_forms_for_every_seed(seed: int) -> None:
    # The page's training (chapter 16) for three seeds, stored on disk: the build reads seed
    # 0's instead of training it again, and the next run of this test reads all three.
    # tests/tooling/test_stored.py shows that a stored run is the fresh one.
    run = stored(train_induction, seed=seed, context_length=64)
    probe = repeated_tokens(64, run.n, len(run.vocab), torch.Generator().manual_seed(123))
    weights = model_weights(run.model, probe)  # (2, 64, 4, T, T)
    assert induction_score(weights[1], probe).max() > 0.7  # a layer-1 induction head
    assert previous_token_score(weights[0]).max() > 0.7  # a layer-0 previous-token head
    assert run.loss_repeated[-1] < 0.25 * math.log(len(run.vocab))
    assert run.loss_first[-1] > 0.9 * math.log(len(run.vocab))  # the random half stays random


def test_weights_come_from_the_forward_in_eval_mode_whatever_the_models_mode() -> None:
    model = model_for()
    model.train()
    for block in model.blocks:
        block.att.dropout.p = 0.5
    weights = model_weights(model, torch.randint(30, (2, 12)))
    assert model.training  # given back as it was
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]), atol=1e-9, rtol=0)
