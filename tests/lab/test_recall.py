"""attention.lab.recall: the induction task, softmax against linear attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.lab.heads import repeated_tokens
from attention.lab.recall import RecallComparison, compare_recall, recall
from attention_site.stored import stored

TINY = {"steps": 3, "n": 4, "batch_size": 4, "emb_dim": 8, "n_heads": 2}


class Copier(nn.Module):
    """Predicts token t + 1 as the token n before it: exact on the repeated half."""

    def __init__(self, n: int, vocab_size: int) -> None:
        super().__init__()
        self.n, self.vocab_size = n, vocab_size

    def forward(self, idx: Tensor) -> Tensor:
        ahead = torch.cat([idx[:, 1 - self.n :], idx], dim=1)[:, : idx.shape[1]]  # x_{t+1-n}
        return F.one_hot(ahead, self.vocab_size).double() * 50.0  # (b, T, V)


def test_recall_is_the_fraction_of_copies_predicted_exactly() -> None:
    idx = repeated_tokens(8, 6, 30, torch.Generator().manual_seed(0))  # (8, 12)
    exact, loss = recall(Copier(6, 30), idx, 6)
    assert exact == pytest.approx(1.0, abs=1e-12) and loss < 1e-12
    wrong = idx.clone()
    wrong[:, 7] = (idx[:, 7] + 1) % 30  # target 7 of the 5 copies 7..11: now missed
    exact, _ = recall(Copier(6, 30), torch.cat([idx, wrong]), 6)  # (16, 12)
    assert exact == pytest.approx(1 - 0.5 / 5, abs=1e-6)  # the half with it wrong misses one


def test_both_trainings_run_the_same_way_and_report_a_recall_each() -> None:
    result = compare_recall(seed=1, **TINY)
    assert isinstance(result, RecallComparison)
    assert result.softmax.layer_types == ("full_attention",) * 2
    assert result.linear.layer_types == ("linear_attention",) * 2
    assert (result.softmax.positions, result.linear.positions) == ("rotary", "learned")
    for run in (result.softmax, result.linear):
        assert 0.0 <= run.recall <= 1.0 and run.loss_repeated > 0 and run.seconds > 0
    assert result.n == 4 and result.steps == 3 and 0 < result.chance < 0.01
    again = compare_recall(seed=1, **TINY)  # seeded: the same numbers
    assert again.linear.recall == pytest.approx(result.linear.recall, abs=1e-12)
    assert again.linear.loss_repeated == pytest.approx(result.linear.loss_repeated, rel=1e-5)


def test_bad_settings_name_the_argument() -> None:
    with pytest.raises(ValueError, match="n must be >= 2, got 1"):
        compare_recall(n=1)
    with pytest.raises(ValueError, match="n_layers must be >= 1, got 0"):
        compare_recall(n_layers=0)
    with pytest.raises(ValueError, match=r"lr must be a finite number > 0, got -1\.0"):
        compare_recall(lr=-1.0)
    with pytest.raises(FloatingPointError, match=r"training diverged at step \d+"):
        compare_recall(lr=1e30, **TINY)


@pytest.mark.heavy(seconds=50)  # both trainings, on one core, where they are not stored yet
def test_softmax_recalls_what_linear_attention_cannot_at_the_pages_settings() -> None:
    # the page's run (Beyond softmax), stored on disk: the build reads it instead of training
    result = stored(compare_recall, seed=0)
    assert result.softmax.recall > 0.8  # it learned the task: an induction head
    assert result.linear.recall < 0.4
    assert result.softmax.recall - result.linear.recall > 0.5
    assert result.linear.recall > 5 * result.chance  # it learned something, not a guess
