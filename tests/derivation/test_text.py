"""The offline GPT-2 tokenizer and the text -> embeddings pipeline (attention.derivation.text)."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attention.derivation.text import (
    ENDOFTEXT,
    GPT2_RANKS_PATH,
    GPT2_RANKS_SHA256,
    GPT2_VOCAB_SIZE,
    GPTDatasetV1,
    RanksIntegrityError,
    TokenAndPositionEmbedding,
    create_dataloader_v1,
    gpt2_encoding,
    load_gpt2_ranks,
    sample_text,
    sliding_windows,
    text_to_token_ids,
    token_ids_to_text,
)
from attention.layer.multihead import MultiHeadAttention

# The opening of Edith Wharton's "The Verdict" (1908, public domain), the book's running text.
VERDICT = "I HAD always thought Jack Gisburn rather a cheap genius--though a good fellow enough"
VERDICT_IDS = [40, 367, 2885, 1464, 1807, 3619, 402, 271, 10899, 2138, 257, 7026, 15632, 438]
VERDICT_IDS += [2016, 257, 922, 5891, 1576]

HELLO = "Hello, do you like tea? <|endoftext|> In the sunlit terraces of the palace."
HELLO_IDS = [15496, 11, 466, 345, 588, 8887, 30, 220, 50256, 554, 262, 4252, 18250, 8812, 2114]
HELLO_IDS += [286, 262, 20562, 13]


# --- the ranks file and its integrity check ---------------------------------------------------


def test_shipped_ranks_have_tiktokens_hash() -> None:
    assert hashlib.sha256(GPT2_RANKS_PATH.read_bytes()).hexdigest() == GPT2_RANKS_SHA256
    assert GPT2_RANKS_SHA256 == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def test_license_ships_next_to_ranks() -> None:
    license_text = (GPT2_RANKS_PATH.parent / "LICENSE-gpt2-tiktoken.txt").read_text()
    assert "MIT License" in license_text
    assert "Copyright (c) 2022 OpenAI" in license_text
    assert "whisper/assets/gpt2.tiktoken" in license_text
    assert GPT2_RANKS_SHA256 in license_text


def test_ranks_are_a_permutation_of_0_to_50255() -> None:
    ranks = load_gpt2_ranks()
    assert len(ranks) == GPT2_VOCAB_SIZE - 1  # every token but <|endoftext|>
    assert sorted(ranks.values()) == list(range(GPT2_VOCAB_SIZE - 1))
    assert all(bytes([b]) in ranks for b in range(256))  # byte-level: any text encodes


def test_corrupt_ranks_raise_naming_file_and_hashes(tmp_path: Path) -> None:
    corrupt = tmp_path / "gpt2.tiktoken"
    shutil.copyfile(GPT2_RANKS_PATH, corrupt)
    data = bytearray(corrupt.read_bytes())
    data[1000] ^= 0x01  # flip one bit of one byte
    corrupt.write_bytes(bytes(data))
    actual = hashlib.sha256(data).hexdigest()

    with pytest.raises(RanksIntegrityError) as excinfo:
        load_gpt2_ranks(corrupt)
    message = str(excinfo.value)
    assert str(corrupt) in message
    assert f"expected sha256 {GPT2_RANKS_SHA256}" in message
    assert f"got {actual}" in message
    assert isinstance(excinfo.value, ValueError)


def test_missing_ranks_raise_naming_file_and_hash(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "gpt2.tiktoken"
    with pytest.raises(RanksIntegrityError, match="cannot be read") as excinfo:
        load_gpt2_ranks(missing)
    assert str(missing) in str(excinfo.value)
    assert GPT2_RANKS_SHA256 in str(excinfo.value)


def test_intact_copy_loads_the_same_ranks(tmp_path: Path) -> None:
    copy = tmp_path / "copy.tiktoken"
    shutil.copyfile(GPT2_RANKS_PATH, copy)
    assert load_gpt2_ranks(copy) == load_gpt2_ranks()


# --- the encoding: offline, lazy, cached ----------------------------------------------------


def test_encoding_builds_with_the_network_unplugged(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    gpt2_encoding.cache_clear()
    enc = gpt2_encoding()
    assert enc.encode(VERDICT) == VERDICT_IDS


def test_encoding_is_cached() -> None:
    assert gpt2_encoding() is gpt2_encoding()


@pytest.mark.slow(seconds=3)
def test_import_attention_does_not_build_the_encoding() -> None:
    code = (
        "import sys, attention, attention.derivation.text as t; "
        "print('tiktoken' in sys.modules, t.gpt2_encoding.cache_info().currsize)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0"]


def test_encoding_vocabulary() -> None:
    enc = gpt2_encoding()
    assert enc.name == "gpt2"
    assert enc.n_vocab == GPT2_VOCAB_SIZE == 50257
    assert enc.eot_token == 50256
    assert enc.special_tokens_set == {ENDOFTEXT}
    assert enc.decode([50256]) == ENDOFTEXT


# --- known ids --------------------------------------------------------------------------------


def test_known_ids_the_verdict() -> None:
    enc = gpt2_encoding()
    assert enc.encode(VERDICT) == VERDICT_IDS
    assert enc.decode(VERDICT_IDS) == VERDICT


def test_known_ids_with_endoftext_allowed() -> None:
    enc = gpt2_encoding()
    ids = enc.encode(HELLO, allowed_special={ENDOFTEXT})
    assert ids == HELLO_IDS
    assert ids.count(50256) == 1
    assert enc.decode(ids) == HELLO


def test_special_token_text_refused_unless_allowed() -> None:
    enc = gpt2_encoding()
    with pytest.raises(ValueError, match="disallowed special token"):
        enc.encode(HELLO)
    # Allowed as plain text instead, it is cut into ordinary pieces: no id 50256.
    as_text = enc.encode(ENDOFTEXT, disallowed_special=())
    assert 50256 not in as_text
    assert len(as_text) > 1
    assert enc.decode(as_text) == ENDOFTEXT


def test_unknown_word_splits_into_sub_word_pieces() -> None:
    enc = gpt2_encoding()
    ids = enc.encode("Akwirw ier")
    assert ids == [33901, 86, 343, 86, 220, 959]
    pieces = [enc.decode([i]) for i in ids]
    assert pieces == ["Ak", "w", "ir", "w", " ", "ier"]
    assert "".join(pieces) == "Akwirw ier"


@given(st.text(max_size=200))
def test_round_trip_any_text(text: str) -> None:
    enc = gpt2_encoding()
    ids = enc.encode(text, disallowed_special=())
    assert all(0 <= i < GPT2_VOCAB_SIZE - 1 for i in ids)
    assert enc.decode(ids) == text


def test_text_to_token_ids_and_back() -> None:
    ids = text_to_token_ids(HELLO)
    assert ids.shape == (1, len(HELLO_IDS))
    assert ids.dtype == torch.long
    assert ids[0].tolist() == HELLO_IDS
    assert token_ids_to_text(ids) == HELLO
    assert token_ids_to_text(ids[0]) == HELLO


def test_token_ids_to_text_refuses_a_batch() -> None:
    with pytest.raises(ValueError, match=r"got shape \(2, 3\)"):
        token_ids_to_text(torch.zeros(2, 3, dtype=torch.long))


# --- the sample text --------------------------------------------------------------------------


def test_sample_text() -> None:
    text = sample_text()
    assert text.startswith("On Reading Slowly\n")
    assert 2000 <= len(text.encode("utf-8")) <= 4096
    enc = gpt2_encoding()
    ids = enc.encode(text)
    assert 500 < len(ids) < 1000
    assert enc.decode(ids) == text


# --- sliding windows --------------------------------------------------------------------------


def test_sliding_windows_book_example() -> None:
    inputs, targets = sliding_windows(VERDICT_IDS, max_length=4, stride=1)
    assert inputs[0].tolist() == [40, 367, 2885, 1464]
    assert targets[0].tolist() == [367, 2885, 1464, 1807]
    assert inputs[1].tolist() == [367, 2885, 1464, 1807]


def test_sliding_windows_drop_the_last_partial_window() -> None:
    # 11 ids, windows of 4 + 1 target, stride 4: starts 0 and 4; a window at 8 would need ids
    # up to 12 and is dropped, so ids 9 and 10 are in no window: (11 - 4 - 1) % 4 = 2.
    inputs, targets = sliding_windows(list(range(11)), max_length=4, stride=4)
    assert inputs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert targets.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]


@given(
    n=st.integers(2, 200),
    max_length=st.integers(1, 20),
    stride=st.integers(1, 25),
)
def test_sliding_windows_properties(n: int, max_length: int, stride: int) -> None:
    if n < max_length + 1:
        with pytest.raises(ValueError, match=f"need at least max_length \\+ 1 = {max_length + 1}"):
            sliding_windows(range(n), max_length, stride)
        return
    token_ids = torch.arange(n) + 1000  # distinct ids: id - 1000 is the position
    inputs, targets = sliding_windows(token_ids, max_length, stride)

    num_windows = (n - max_length - 1) // stride + 1
    assert inputs.shape == targets.shape == (num_windows, max_length)
    assert inputs.dtype == targets.dtype == torch.long
    for k in range(num_windows):  # stride honoured, targets shifted by one
        start = k * stride
        assert torch.equal(inputs[k], token_ids[start : start + max_length])
        assert torch.equal(targets[k], token_ids[start + 1 : start + max_length + 1])

    # No token lost but the documented tail, fewer than `stride` ids.
    tail = (n - max_length - 1) % stride
    assert tail < stride
    covered = set((torch.cat([inputs.flatten(), targets.flatten()]) - 1000).tolist())
    assert max(covered) == n - 1 - tail
    if stride <= max_length:
        assert covered == set(range(n - tail))
    else:  # a stride past max_length skips stride - max_length ids between windows
        assert len(covered) == num_windows * (max_length + 1)


@pytest.mark.parametrize(
    ("token_ids", "max_length", "stride", "match"),
    [
        ([1, 2, 3], 0, 1, "max_length must be >= 1, got 0"),
        ([1, 2, 3], 2, 0, "stride must be >= 1, got 0"),
        ([1, 2, 3], 3, 1, "need at least max_length \\+ 1 = 4 token ids .* got 3"),
        (
            torch.zeros(2, 5, dtype=torch.long),
            2,
            1,
            "expected token ids of shape \\(n,\\), got shape \\(2, 5\\)",
        ),
    ],
)
def test_sliding_windows_bad_input(
    token_ids: object, max_length: int, stride: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        sliding_windows(token_ids, max_length, stride)  # type: ignore[arg-type]


def test_dataset_matches_sliding_windows() -> None:
    dataset = GPTDatasetV1(HELLO, gpt2_encoding(), max_length=4, stride=2)
    inputs, targets = sliding_windows(HELLO_IDS, max_length=4, stride=2)
    assert len(dataset) == inputs.shape[0] == (len(HELLO_IDS) - 4 - 1) // 2 + 1
    for k in range(len(dataset)):
        x, y = dataset[k]
        assert x.shape == y.shape == (4,)
        assert torch.equal(x, inputs[k])
        assert torch.equal(y, targets[k])


def test_dataloader_book_example() -> None:
    loader = create_dataloader_v1(VERDICT, batch_size=1, max_length=4, stride=1, shuffle=False)
    batches = iter(loader)
    first_inputs, first_targets = next(batches)
    assert first_inputs.tolist() == [[40, 367, 2885, 1464]]
    assert first_targets.tolist() == [[367, 2885, 1464, 1807]]
    second_inputs, _ = next(batches)
    assert second_inputs.tolist() == [[367, 2885, 1464, 1807]]


def test_dataloader_batches_of_the_sample_text() -> None:
    loader = create_dataloader_v1(sample_text(), batch_size=8, max_length=4, stride=4)
    num_windows = (len(gpt2_encoding().encode(sample_text())) - 4 - 1) // 4 + 1
    batches = list(loader)
    assert len(batches) == num_windows // 8  # drop_last
    for inputs, targets in batches:
        assert inputs.shape == targets.shape == (8, 4)


# --- embeddings -------------------------------------------------------------------------------


def test_token_embedding_reproduces_the_book_under_seed_123() -> None:
    torch.manual_seed(123)
    embedding = TokenAndPositionEmbedding(GPT2_VOCAB_SIZE, context_length=8, d_in=5)
    tok_embeds = embedding.tok_emb(torch.tensor(VERDICT_IDS[:8]))  # (8, 5)
    expected_first = torch.tensor([1.1721, -0.4372, -0.4053, 0.7086, 0.9533])
    expected_sixth = torch.tensor([-1.1976, -1.5655, -1.2657, -0.3559, -0.7629])
    expected_402 = torch.tensor([1.6024, -0.6694, -1.0676, -0.3782, 1.8112])
    torch.testing.assert_close(tok_embeds[0], expected_first, atol=1e-4, rtol=0)
    torch.testing.assert_close(tok_embeds[5], expected_sixth, atol=1e-4, rtol=0)
    torch.testing.assert_close(tok_embeds[6], expected_402, atol=1e-4, rtol=0)


def test_embedding_adds_one_position_row_per_token(device: torch.device) -> None:
    embedding = TokenAndPositionEmbedding(vocab_size=10, context_length=6, d_in=3).to(device)
    token_ids = torch.tensor([[1, 2, 3, 1], [4, 4, 4, 4]], device=device)  # (batch=2, num_tokens=4)
    x = embedding(token_ids)
    assert x.shape == (2, 4, 3)
    assert x.device.type == device.type
    pos = embedding.pos_emb.weight[:4]  # (num_tokens, d_in)
    torch.testing.assert_close(x - embedding.tok_emb(token_ids), pos.expand(2, 4, 3))
    assert not torch.allclose(x[0, 0], x[0, 3])  # same token, different positions
    assert not torch.allclose(x[1, 0], x[1, 1])


def test_embedding_refuses_too_long_or_wrong_rank() -> None:
    embedding = TokenAndPositionEmbedding(vocab_size=10, context_length=4, d_in=3)
    with pytest.raises(ValueError, match="sequence of 5 tokens is longer than context_length=4"):
        embedding(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"\(batch, num_tokens\), got a 1-d tensor of shape \(4,\)"
    ):
        embedding(torch.zeros(4, dtype=torch.long))


def test_pipeline_text_to_attention() -> None:
    """Text -> windows -> (batch, num_tokens, d_in) -> the production attention module."""
    torch.manual_seed(123)
    batch_size, max_length, d_in = 8, 4, 256
    loader = create_dataloader_v1(
        sample_text(), batch_size=batch_size, max_length=max_length, stride=max_length
    )
    embedding = TokenAndPositionEmbedding(GPT2_VOCAB_SIZE, context_length=max_length, d_in=d_in)
    inputs, _ = next(iter(loader))  # (batch, num_tokens)
    x = embedding(inputs)
    assert x.shape == (batch_size, max_length, d_in)
    mha = MultiHeadAttention(d_in, d_out=64, context_length=max_length, dropout=0.0, num_heads=4)
    assert mha(x).shape == (batch_size, max_length, 64)


@pytest.mark.parametrize(
    ("token_ids", "error", "match"),
    [
        (torch.tensor([6109, -1]), ValueError,
         r"token_ids must be in 0 .. 50256 \(vocab_size=50257\), got ids from -1 to 6109"),
        (torch.tensor([[50257]]), ValueError, r"got ids from 50257 to 50257"),
        (torch.tensor([1.0, 2.0]), TypeError, r"integer ids, got dtype torch.float32"),
        ([1.0, 2.0], TypeError, r"token_ids must be integer ids \(a tensor, or ints\), got \[1.0"),
    ],
)  # fmt: skip
def test_token_ids_to_text_rejects_what_is_no_token(
    token_ids: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        token_ids_to_text(token_ids)  # type: ignore[arg-type]


@pytest.mark.parametrize("ids", [[1.0, 2.5, 3.7, 4.2], torch.tensor([1.0, 2.0, 3.0, 4.0])])
def test_sliding_windows_refuses_float_ids_instead_of_truncating(ids: object) -> None:
    with pytest.raises(TypeError, match=r"token_ids must be integer ids"):
        sliding_windows(ids, max_length=2, stride=1)  # type: ignore[arg-type]


def test_a_ranks_path_that_is_a_directory_is_an_integrity_error(tmp_path: Path) -> None:
    with pytest.raises(RanksIntegrityError, match="cannot be read") as excinfo:
        load_gpt2_ranks(tmp_path)
    assert str(tmp_path) in str(excinfo.value)


def test_embedding_rejects_float_and_out_of_vocabulary_ids() -> None:
    embedding = TokenAndPositionEmbedding(10, context_length=4, d_in=3)
    with pytest.raises(TypeError, match=r"integer ids, got dtype torch\.float32"):
        embedding(torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"token_ids must be in 0 .. 9 \(vocab_size=10\), got "
                                         r"ids from -1 to 10"):  # fmt: skip
        embedding(torch.tensor([[-1, 10]]))
    with pytest.raises(ValueError, match="context_length must be >= 1, got 0"):
        TokenAndPositionEmbedding(10, context_length=0, d_in=3)


def test_numpy_ids_are_ids_and_meta_ids_are_refused() -> None:
    import numpy as np

    inputs, _ = sliding_windows(np.arange(10), max_length=3, stride=2)
    assert inputs[1].tolist() == [2, 3, 4]
    embedding = TokenAndPositionEmbedding(10, context_length=4, d_in=3)
    with pytest.raises(ValueError, match=r"token_ids must be on cpu \(the embedding's device\)"):
        embedding(torch.tensor([[1, 2]], device="meta"))
    with pytest.raises(TypeError, match=r"tokenizer must be a tiktoken.Encoding"):
        text_to_token_ids("hi", "gpt2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"token_ids must fit in int64"):
        sliding_windows([2**70, 1, 2], 1, 1)
