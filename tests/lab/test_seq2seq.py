"""Chapter 14's transformer encoder-decoder: shapes, cross-attention caches, training, errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attention.lab.copy_task import copy_batch, evaluate_by_length, train
from attention.lab.rnn import decoder_inputs
from attention.lab.seq2seq import (
    DecoderBlock,
    EncoderBlock,
    Seq2SeqTransformer,
    transformer_experiment,
)
from attention.layer.cache import KVCache

VOCAB_SIZE = 20


@pytest.fixture
def model() -> Seq2SeqTransformer:
    torch.manual_seed(0)
    return Seq2SeqTransformer(VOCAB_SIZE, d_model=16, num_heads=2, num_layers=2).eval()


def batch(batch_size: int = 3, seq_len: int = 7, seed: int = 0) -> torch.Tensor:
    src, _ = copy_batch(batch_size, seq_len, VOCAB_SIZE, torch.Generator().manual_seed(seed))
    return src


def test_shapes(model: Seq2SeqTransformer) -> None:
    src = batch()
    tgt_in = decoder_inputs(batch(seq_len=4, seed=1), model.bos)  # m = 4 != n = 7
    logits, weights = model(src, tgt_in, need_weights=True)
    assert logits.shape == (3, 4, VOCAB_SIZE)
    assert [w.shape for w in weights] == [(3, 2, 4, 7)] * 2  # per decoder block
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3, 2, 4))
    assert model(src, tgt_in)[1] == []
    assert model.encode(src).shape == (3, 7, 16)
    assert model.generate(src).shape == (3, 7)
    assert model.generate(src, out_len=3).shape == (3, 3)
    assert EncoderBlock(8, 2, 10)(torch.randn(2, 5, 8)).shape == (2, 5, 8)


def test_cross_attention_sees_every_input_token(model: Seq2SeqTransformer) -> None:
    """No causal mask between two sequences: the first output reads the last input."""
    src = batch()
    tgt_in = decoder_inputs(batch(seq_len=4, seed=1), model.bos)
    changed = src.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB_SIZE
    with torch.no_grad():
        before, weights = model(src, tgt_in, need_weights=True)
        after, _ = model(changed, tgt_in)
    assert bool((weights[0][:, :, 0, -1] > 0).all())
    assert not torch.allclose(before[:, 0], after[:, 0])


@pytest.mark.parametrize("out_len", [1, 5, 9])
def test_cached_greedy_decoding_equals_uncached(model: Seq2SeqTransformer, out_len: int) -> None:
    src = batch()
    cached = model.generate(src, out_len, use_cache=True)
    assert torch.equal(cached, model.generate(src, out_len, use_cache=False))


def test_cached_logits_equal_teacher_forced(model: Seq2SeqTransformer) -> None:
    src, tgt_in = batch(), decoder_inputs(batch(seed=1), model.bos)
    with torch.no_grad():
        full, _ = model(src, tgt_in)  # (3, 7, V)
        memory = model.encode(src)
        caches = model.init_caches(3, src_len=7, out_len=7)
        steps = [model.decode(tgt_in[:, t : t + 1], memory if t == 0 else None,
                              caches=caches)[0] for t in range(7)]  # fmt: skip
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_the_cross_attention_cache_is_filled_once(model: Seq2SeqTransformer) -> None:
    """The memory's keys are projected at the first step only, in every decoder block."""
    src = batch()
    calls: list[int] = []
    hooks = [
        block.cross_att.W_key.register_forward_hook(
            lambda module, inputs, output: calls.append(inputs[0].shape[1])
        )
        for block in model.decoder
        if isinstance(block, DecoderBlock)
    ]
    model.generate(src, out_len=5)
    assert calls == [7, 7]  # once per block, on the n = 7 input tokens
    calls.clear()
    model.generate(src, out_len=5, use_cache=False)
    assert calls == [7, 7] * 5  # every block at every step
    for hook in hooks:
        hook.remove()
    caches = model.init_caches(3, src_len=7, out_len=5)
    with torch.no_grad():
        model.decode(torch.full((3, 1), model.bos), model.encode(src), caches=caches)
        model.decode(torch.zeros(3, 1, dtype=torch.long), None, caches=caches)
    assert [(s.length, c.length) for s, c in caches] == [(2, 7), (2, 7)]
    with pytest.raises(ValueError, match="already holds 7 keys"):  # no second fill
        model.decode(torch.zeros(3, 1, dtype=torch.long), model.encode(src), caches=caches)


def test_source_padding_changes_nothing_real(model: Seq2SeqTransformer) -> None:
    """A right-padded source decodes as the unpadded one, with or without the caches."""
    short, long = batch(1, 4), batch(1, 7, seed=1)
    padded = torch.cat([short, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # (1, 7)
    src = torch.cat([padded, long])  # (2, 7)
    padding = torch.tensor([[False] * 4 + [True] * 3, [False] * 7])
    for use_cache in (True, False):
        tokens = model.generate(src, 6, padding=padding, use_cache=use_cache)
        assert torch.equal(tokens[:1], model.generate(short, 6))
        assert torch.equal(tokens[1:], model.generate(long, 6))


def test_training_beats_chance(one_thread: None) -> None:
    torch.manual_seed(0)
    model = Seq2SeqTransformer(VOCAB_SIZE, d_model=32, num_heads=2)
    losses = train(model, steps=60, batch_size=128, max_len=8)  # chapter 1's loop
    assert len(losses) == 60 and losses[-1] < losses[0]
    accuracy = evaluate_by_length(model, [4, 8], num_seqs=64, seed=1)
    assert min(accuracy) > 3 / VOCAB_SIZE  # chance is 1 / 20
    assert not model.training


@pytest.mark.slow(seconds=2)
def test_experiment_is_seeded_and_aligned(one_thread: None) -> None:
    first = transformer_experiment(0, steps=40, d_model=16)
    again = transformer_experiment(0, steps=40, d_model=16)  # trains again, the same way
    assert again is not first and again.losses == pytest.approx(first.losses, rel=1e-6)
    assert again.accuracy == pytest.approx(first.accuracy, abs=1e-9)
    assert first.lengths == list(range(2, 13)) and len(first.accuracy) == 11
    assert len(first.losses) == 40 and first.seconds > 0
    assert first.cross_weights.shape == (2, 12, 12)
    assert len(first.source_tokens) == len(first.output_tokens) == 12


def test_bad_inputs_are_named(model: Seq2SeqTransformer) -> None:
    src = batch()
    tgt_in = decoder_inputs(src, model.bos)
    with pytest.raises(ValueError, match="src"):
        model.generate(torch.tensor([[VOCAB_SIZE]]))  # bos is not a source token
    with pytest.raises(ValueError, match="src"):
        model.generate(torch.zeros(1, 65, dtype=torch.long))  # past context_length
    with pytest.raises(TypeError, match="src"):
        model.generate(torch.zeros(1, 3))  # float ids
    with pytest.raises(ValueError, match="tgt_in"):
        model(src, torch.zeros(3, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        model(src, tgt_in[:2])
    with pytest.raises(ValueError, match="padding: key_padding_mask must have shape"):
        model(src, tgt_in, padding=torch.zeros(3, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="padding: key_padding_mask must be a bool"):
        model.generate(src, padding=torch.zeros(3, 7))
    with pytest.raises(ValueError, match="out_len"):
        model.generate(src, out_len=0)
    with pytest.raises(ValueError, match="out_len=65 exceeds"):
        model.generate(src, out_len=65)
    with pytest.raises(ValueError, match="memory is None"):
        model.decoder[0](torch.randn(3, 1, 16), None)
    with pytest.raises(TypeError, match="vocab_size and bos"):
        train(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_len"):
        train(model, min_len=5, max_len=4)
    with pytest.raises(ValueError, match="context_length 64, got 65"):
        train(model, max_len=65)
    with pytest.raises(TypeError, match="lengths"):
        evaluate_by_length(model, 5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size"):
        Seq2SeqTransformer(1)
    with pytest.raises(ValueError, match="d_model"):
        Seq2SeqTransformer(VOCAB_SIZE, d_model=15)  # odd: no sin/cos pairs


def caches_of(model: Seq2SeqTransformer, filled: int = 0) -> list[tuple[KVCache, KVCache]]:
    """`init_caches` for a batch of 3, 7 source tokens, 64 output tokens; `filled` of them
    decoded already."""
    caches = model.init_caches(3, src_len=7, out_len=64)
    memory = model.encode(batch())
    with torch.no_grad():
        for t in range(filled):
            model.decode(torch.zeros(3, 1, dtype=torch.long), memory if t == 0 else None,
                         caches=caches)  # fmt: skip
    return caches


ENCODER, DECODER = EncoderBlock(8, 2, 16), DecoderBlock(8, 2, 16)
Y, MEMORY = torch.randn(2, 5, 8), torch.randn(2, 6, 8)
SHAPE = r"expected input of shape \(batch, num_tokens, d_in\) with d_in=8, got"
# (call, error, message): each names the argument, what it expected and what it got, where
# torch's own error (a layer norm's, an embedding's) names none of them
BLOCK_ERRORS = {
    "encoder width": (lambda: ENCODER(torch.randn(2, 5, 9)), ValueError,
                      rf"^x: {SHAPE} last dimension 9 \(shape \(2, 5, 9\)\)"),
    "encoder ids": (lambda: ENCODER(torch.zeros(2, 5, 8, dtype=torch.long)), TypeError,
                    r"^x: expected a floating-point input .*got dtype torch\.int64"),
    "encoder list": (lambda: ENCODER([[1.0]]), TypeError, r"^x must be a torch\.Tensor, got list"),
    "encoder padding": (lambda: ENCODER(Y, torch.zeros(2, 4, dtype=torch.bool)), ValueError,
                        r"^padding: key_padding_mask must have shape .* = \(2, 5\), got \(2, 4\)"),
    "decoder width": (lambda: DECODER(torch.randn(2, 5, 9), MEMORY), ValueError,
                      rf"^y: {SHAPE} last dimension 9"),
    "memory width": (lambda: DECODER(Y, torch.randn(2, 6, 9)), ValueError,
                     rf"^memory: {SHAPE} last dimension 9"),
    "memory rank": (lambda: DECODER(Y, torch.randn(6, 8)), ValueError,
                    rf"^memory: {SHAPE} a 2-d tensor of shape \(6, 8\)"),
    "memory dtype": (lambda: DECODER(Y, MEMORY.double()), TypeError,
                     r"^memory: expected input of dtype torch\.float32 .*got torch\.float64"),
    "memory batch": (lambda: DECODER(Y, torch.randn(3, 6, 8)), ValueError,
                     r"y and memory must have one batch size, got 2 and 3"),
    "decoder caches": (lambda: DECODER(Y, MEMORY, caches=3), TypeError,  # type: ignore[arg-type]
                       r"caches must be a \(self_cache, cross_cache\) pair of KVCaches, from "
                       r"init_caches\(\), got int 3"),
    "encoder d_model": (lambda: EncoderBlock("8", 2, 16), TypeError,  # type: ignore[arg-type]
                        r"d_model must be an int, got '8' \(str\)"),
    "decoder heads": (lambda: DecoderBlock(8, 3, 16), ValueError,
                      r"d_model must be divisible by num_heads, got d_model=8, num_heads=3"),
    "model d_model": (lambda: Seq2SeqTransformer(VOCAB_SIZE, "16"),  # type: ignore[arg-type]
                      TypeError, r"d_model must be an int, got '16' \(str\)"),
    "model d_model float": (lambda: Seq2SeqTransformer(VOCAB_SIZE, 16.0),  # type: ignore[arg-type]
                            TypeError, r"d_model must be an int, got 16\.0 \(float\)"),
    "model heads": (lambda: Seq2SeqTransformer(VOCAB_SIZE, d_model=16, num_heads=3), ValueError,
                    r"d_model must be divisible by num_heads, got d_model=16, num_heads=3"),
    "experiment d_model": (lambda: transformer_experiment(d_model="16"),  # type: ignore[arg-type]
                           TypeError, r"d_model must be an int, got '16' \(str\)"),
    "experiment lr": (lambda: transformer_experiment(lr="0.1"),  # type: ignore[arg-type]
                      ValueError, r"lr must be a finite number > 0, got '0\.1'"),
    "experiment lr below 0": (lambda: transformer_experiment(lr=-1.0), ValueError,
                              r"lr must be a finite number > 0, got -1\.0"),
}  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), BLOCK_ERRORS.values(),
                         ids=BLOCK_ERRORS.keys())  # fmt: skip
def test_the_blocks_and_the_sizes_name_a_bad_input(call: Any, error: type[Exception],
                                                   message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        call()


MODEL_ERRORS = {
    "encode float ids": (lambda m: m.encode(torch.zeros(2, 3)), TypeError,
                         r"src must be integer ids, got dtype torch\.float32"),
    "encode bos": (lambda m: m.encode(torch.full((2, 3), VOCAB_SIZE)), ValueError,
                   r"src must be in 0 \.\. 19 \(vocab_size=20\), got ids from 20 to 20"),
    "encode padding": (lambda m: m.encode(batch(), torch.zeros(3, 6, dtype=torch.bool)),
                       ValueError, r"padding: key_padding_mask must have shape"),
    "decode ids": (lambda m: m.decode(torch.full((3, 2), 25), m.encode(batch())), ValueError,
                   r"tgt_in must be in 0 \.\. 20 \(vocab_size=21\), got ids from 25 to 25"),
    "decode caches": (lambda m: m.decode(torch.zeros(3, 1, dtype=torch.long), None, caches=3),
                      TypeError, r"caches must be init_caches\(\)'s list of 2 \(self_cache, "
                                 r"cross_cache\) pairs, one per decoder block, got int 3"),
    "decode past the context": (lambda m: m.decode(torch.zeros(3, 2, dtype=torch.long), None,
                                                   caches=caches_of(m, 63)),
                                ValueError, r"tgt_in's 2 tokens after the 63 the caches hold "
                                            r"exceed context_length=64"),
    "init_caches src_len": (lambda m: m.init_caches(3, src_len=65, out_len=4), ValueError,
                            r"src_len=65 exceeds context_length=64"),
    "init_caches out_len": (lambda m: m.init_caches(3, src_len=4, out_len="4"), TypeError,
                            r"out_len must be an int, got '4' \(str\)"),
    "generate use_cache": (lambda m: m.generate(batch(), use_cache="no"), TypeError,
                           r"use_cache must be True or False, got 'no' \(str\)"),
}  # fmt: skip


@pytest.mark.parametrize(("call", "error", "message"), MODEL_ERRORS.values(),
                         ids=MODEL_ERRORS.keys())  # fmt: skip
def test_encode_decode_and_caches_name_a_bad_input(
    model: Seq2SeqTransformer, call: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        call(model)
