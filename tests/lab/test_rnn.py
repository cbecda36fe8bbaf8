"""The "why attention" experiment: GRU encoder-decoders with and without Bahdanau attention."""

from __future__ import annotations

import math

import pytest
import torch

from attention.lab.copy_task import (
    ExperimentResult,
    copy_batch,
    evaluate_by_length,
    run_experiment,
    token_letters,
    train,
)
from attention.lab.rnn import AdditiveAttention, Seq2Seq, decoder_inputs
from attention_site.stored import stored

VOCAB_SIZE = 20
SMALL_BUDGET = {"max_len": 10, "steps": 200, "batch_size": 128}
"""A few seconds per seed: enough for the gap between the models to be wide already."""


@pytest.fixture(scope="module")
def small_runs() -> dict[int, ExperimentResult]:
    """The experiment at the small budget, once per seed, shared by the tests below, and
    stored on disk: the next run of the suite reads it (`attention_site.stored`)."""
    return {seed: stored(run_experiment, seed=seed, **SMALL_BUDGET) for seed in (0, 1, 2)}


def test_copy_batch_is_seeded_and_copies() -> None:
    src, tgt = copy_batch(8, 5, VOCAB_SIZE, torch.Generator().manual_seed(3))
    again, _ = copy_batch(8, 5, VOCAB_SIZE, torch.Generator().manual_seed(3))
    assert src.shape == tgt.shape == (8, 5)
    assert src.dtype == torch.int64
    assert torch.equal(src, tgt) and tgt.data_ptr() != src.data_ptr()
    assert torch.equal(src, again)
    assert 0 <= int(src.min()) and int(src.max()) < VOCAB_SIZE


def test_copy_batch_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
        copy_batch(2, 0, VOCAB_SIZE, torch.Generator())


def test_decoder_inputs_shift_right_behind_bos() -> None:
    tgt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert decoder_inputs(tgt, bos=20).tolist() == [[20, 1, 2], [20, 4, 5]]


def test_token_letters() -> None:
    assert token_letters([0, 2, 25]) == ["a", "c", "z"]


def test_additive_attention_matches_its_equations() -> None:
    attn = AdditiveAttention(hidden_size=6)
    enc_states, s_prev = torch.randn(3, 5, 6), torch.randn(3, 6)  # (B, n, H), (B, H)
    context_vec, attn_weights = attn(s_prev, enc_states)
    assert context_vec.shape == (3, 6) and attn_weights.shape == (3, 5)
    # e_{t,i} = v^T tanh(W s_{t-1} + U h_i), one (b, i) at a time
    W, U, v = attn.W.weight.detach(), attn.U.weight.detach(), attn.v.weight.detach()[0]
    e = torch.tensor(
        [[float(v @ torch.tanh(W @ s_prev[b] + U @ enc_states[b, i])) for i in range(5)]
         for b in range(3)]
    )  # fmt: skip
    alpha = torch.softmax(e, dim=-1)
    torch.testing.assert_close(attn_weights, alpha)
    torch.testing.assert_close(context_vec, torch.einsum("bi,bih->bh", alpha, enc_states))
    torch.testing.assert_close(attn_weights.sum(-1), torch.ones(3))


@pytest.mark.parametrize("attention", [False, True])
def test_seq2seq_shapes_and_alignments_sum_to_one(attention: bool) -> None:
    model = Seq2Seq(VOCAB_SIZE, embed_dim=8, hidden_size=12, attention=attention)
    src, tgt = copy_batch(4, 7, VOCAB_SIZE, torch.Generator().manual_seed(0))
    logits, alignments = model(src, decoder_inputs(tgt, model.bos))
    assert logits.shape == (4, 7, VOCAB_SIZE)
    tokens, generated_alignments = model.generate(src, out_len=5)
    assert tokens.shape == (4, 5) and tokens.dtype == torch.int64
    if not attention:
        assert alignments is None and generated_alignments is None
        return
    assert alignments is not None and generated_alignments is not None
    assert alignments.shape == (4, 7, 7) and generated_alignments.shape == (4, 5, 7)
    assert bool((alignments >= 0).all())
    torch.testing.assert_close(alignments.sum(-1), torch.ones(4, 7))
    torch.testing.assert_close(generated_alignments.sum(-1), torch.ones(4, 5))


def test_encode_returns_every_state_and_the_final_one() -> None:
    """h_n, all that the plain decoder sees, is the last of the states attention can see."""
    model = Seq2Seq(VOCAB_SIZE, attention=False)
    src = torch.tensor([[1, 2, 3, 4]])
    enc_states, h_n = model.encode(src)
    assert enc_states.shape == (1, 4, 32) and h_n.shape == (1, 32)
    torch.testing.assert_close(h_n, enc_states[:, -1])  # the last state is the final state


def test_teacher_forcing_and_greedy_agree_on_the_first_step() -> None:
    model = Seq2Seq(VOCAB_SIZE, attention=True)
    src, tgt = copy_batch(3, 6, VOCAB_SIZE, torch.Generator().manual_seed(1))
    logits, _ = model(src, decoder_inputs(tgt, model.bos))
    tokens, _ = model.generate(src)
    assert torch.equal(tokens[:, 0], logits[:, 0].argmax(-1))  # both start from y_0 = bos


def test_bad_shapes_raise() -> None:
    model = Seq2Seq(VOCAB_SIZE)
    with pytest.raises(ValueError, match=r"expected src \(batch, in_len\)"):
        model(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(5,\)"):
        model.generate(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="min_len <= max_len"):
        train(model, steps=1, min_len=5, max_len=4)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow(seconds=2)
def test_training_lowers_the_loss_and_is_deterministic() -> None:
    kwargs = {"steps": 30, "batch_size": 32, "max_len": 5, "seed": 4}
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Seq2Seq(VOCAB_SIZE, attention=True)
        runs.append(train(model, **kwargs))
    losses = runs[0]
    assert len(losses) == 30
    assert abs(losses[0] - math.log(VOCAB_SIZE)) < 0.3  # starts near chance, ln V nats
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    assert runs[0] == runs[1]  # same seed, same weights: the same losses, bit for bit
    accuracy = evaluate_by_length(model, [2, 3], num_seqs=64, seed=5)
    assert len(accuracy) == 2 and all(0.0 <= a <= 1.0 for a in accuracy)


def test_run_experiment_leaves_global_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    result = run_experiment(0, max_len=3, steps=2, batch_size=4, num_seqs=4)
    assert torch.equal(torch.rand(3), expected)  # the global RNG did not move
    assert torch.get_num_threads() == threads
    assert result.lengths == [2, 3]
    assert result.alignment.shape == (3, 3)
    assert len(result.source_tokens) == len(result.output_tokens) == 3
    assert len(result.plain_losses) == len(result.attention_losses) == 2
    assert result.runtime_seconds == result.plain_seconds + result.attention_seconds > 0


@pytest.mark.heavy(seconds=14)  # the three seeds' runs, where they are not stored yet
def test_attention_beats_the_bottleneck_at_length(small_runs: dict[int, ExperimentResult]) -> None:
    """The experiment's conclusion, at a small budget, for three seeds."""
    for seed, result in small_runs.items():
        plain, attn = result.plain_accuracy, result.attention_accuracy
        assert plain[0] >= 0.95, (seed, plain)  # the plain model learned the short sequences
        assert plain[0] - plain[-1] >= 0.5, (seed, plain)  # and falls as they grow
        assert attn[-1] - plain[-1] >= 0.3, (seed, attn, plain)  # attention holds far better
        assert result.attention_losses[-1] < result.plain_losses[-1], seed


@pytest.mark.heavy
def test_alignment_follows_the_diagonal(small_runs: dict[int, ExperimentResult]) -> None:
    """For copying, output step t looks at input position t (and a little at its neighbours)."""
    n = 6
    src, _ = copy_batch(64, n, VOCAB_SIZE, torch.Generator().manual_seed(99))
    near = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= 1  # (n, n) band
    for seed, result in small_runs.items():
        _, alignments = result.attention_model.generate(src)  # (64, n, n)
        assert alignments is not None
        alpha = alignments.mean(0)  # (n, n): the average alignment
        position = alpha @ torch.arange(n, dtype=alpha.dtype)  # (n,): where each step looks
        assert bool((position.diff() > 0).all()), (seed, position)  # it moves along the input
        assert float((position - torch.arange(n)).abs().max()) <= 1.0, (seed, position)
        assert float(alpha[near].sum() / n) >= 0.7, (seed, alpha)  # most weight on the band
        assert result.alignment.shape == (SMALL_BUDGET["max_len"],) * 2


@pytest.mark.heavy(seconds=5)
def test_experiment_is_deterministic(small_runs: dict[int, ExperimentResult]) -> None:
    again = run_experiment(0, **SMALL_BUDGET)  # fresh: equals the stored run, bit for bit
    first = small_runs[0]
    assert again.plain_accuracy == first.plain_accuracy
    assert again.attention_accuracy == first.attention_accuracy
    assert again.attention_losses == first.attention_losses
    assert torch.equal(again.alignment, first.alignment)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m.generate(torch.zeros(2, 3, dtype=torch.long), out_len=0), ValueError,
         r"out_len must be >= 1, got 0"),
        (lambda m: m.generate(torch.zeros(2, 0, dtype=torch.long)), ValueError,
         r"src of shape \(batch, length\), both >= 1, got \(2, 0\)"),
        (lambda m: m.generate(torch.full((1, 3), VOCAB_SIZE)), ValueError,
         rf"src must be in 0 .. {VOCAB_SIZE - 1} .* got ids from {VOCAB_SIZE} to {VOCAB_SIZE}"),
        (lambda m: m.generate(torch.zeros(1, 3)), TypeError,
         r"src must be integer ids, got dtype torch.float32"),
        (lambda m: train(m, steps=0), ValueError, r"steps must be >= 1, got 0"),
        (lambda m: train(m, steps=1, batch_size=0), ValueError, r"batch_size must be >= 1"),
        (lambda m: evaluate_by_length(m, [0]), ValueError, r"each of lengths must be >= 1"),
        (lambda m: Seq2Seq(1), ValueError, r"vocab_size must be >= 2, got 1"),
        (lambda m: Seq2Seq(VOCAB_SIZE, hidden_size=8.0), TypeError, r"hidden_size must be an int"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_naming_them(call: object, error: type[Exception], match: str) -> None:
    model = Seq2Seq(VOCAB_SIZE)
    with pytest.raises(error, match=match):
        call(model)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("s_prev", "enc_states", "match"),
    [
        ((2, 1, 4), (2, 3, 4), r"s_prev of shape \(batch, H\) = \(2, 4\), got \(2, 1, 4\)"),
        ((3, 4), (2, 3, 4), r"s_prev of shape \(batch, H\) = \(2, 4\), got \(3, 4\)"),
        ((2, 4), (2, 3, 5), r"enc_states of shape \(batch, in_len, H=4\).*got \(2, 3, 5\)"),
        ((2, 4), (2, 0, 4), r"in_len >= 1, got \(2, 0, 4\)"),
    ],
)
def test_additive_attention_checks_shapes(
    s_prev: tuple[int, ...], enc_states: tuple[int, ...], match: str
) -> None:
    """A 3-d s_prev used to broadcast into a wrong shape instead of failing."""
    attn = AdditiveAttention(hidden_size=4)
    with pytest.raises(ValueError, match=match):
        attn(torch.randn(s_prev), torch.randn(enc_states))
