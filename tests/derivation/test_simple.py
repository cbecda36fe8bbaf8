"""Stage 1 reproduces the seeds' numbers, and its loop and matrix forms agree."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention import (
    attn_scores_for_query,
    attn_scores_loop,
    attn_scores_matrix,
    context_vector,
    context_vectors,
    example_inputs,
    normalize_by_sum,
    simplified_self_attention,
    softmax_naive,
    softmax_stable,
)
from tests import expected as E


def test_scores_for_query_journey() -> None:
    inputs = example_inputs()
    assert_close(attn_scores_for_query(inputs, inputs[1]), E.SCORES_JOURNEY, atol=E.ATOL, rtol=0)


def test_three_normalisations_for_journey() -> None:
    inputs = example_inputs()
    scores = attn_scores_for_query(inputs, inputs[1])
    assert_close(normalize_by_sum(scores), E.SUM_NORMALISED_JOURNEY, atol=E.ATOL, rtol=0)
    assert_close(softmax_naive(scores), E.SOFTMAX_JOURNEY, atol=E.ATOL, rtol=0)
    assert_close(softmax_stable(scores), E.SOFTMAX_JOURNEY, atol=E.ATOL, rtol=0)


def test_context_vector_for_journey_loop_and_matrix() -> None:
    inputs = example_inputs()
    weights = softmax_stable(attn_scores_for_query(inputs, inputs[1]))
    z_loop = context_vector(inputs, weights)
    assert_close(z_loop, E.CONTEXT_JOURNEY, atol=E.ATOL, rtol=0)
    # The matrix form's row 2 is the same vector.
    z_all = context_vectors(inputs, softmax_stable(attn_scores_matrix(inputs)))
    assert_close(z_all[1], z_loop)


def test_full_six_by_six_matrices() -> None:
    inputs = example_inputs()
    assert_close(attn_scores_matrix(inputs), E.ATTN_SCORES, atol=E.ATOL, rtol=0)
    assert_close(attn_scores_loop(inputs), E.ATTN_SCORES, atol=E.ATOL, rtol=0)
    context_vecs, attn_weights = simplified_self_attention(inputs)
    assert attn_weights.shape == (6, 6)
    assert context_vecs.shape == (6, 3)
    assert_close(attn_weights, E.ATTN_WEIGHTS, atol=E.ATOL, rtol=0)
    assert_close(context_vecs, E.CONTEXT_VECS, atol=E.ATOL, rtol=0)


def test_loop_equals_matrix_exactly_on_random_inputs() -> None:
    x = torch.randn(7, 5)
    assert_close(attn_scores_loop(x), attn_scores_matrix(x))


def test_naive_softmax_overflows_where_stable_does_not() -> None:
    scores = torch.tensor([10.0, 100.0, 1000.0])
    assert torch.isnan(softmax_naive(scores)).any()
    stable = softmax_stable(scores)
    assert torch.isfinite(stable).all()
    assert_close(stable, torch.tensor([0.0, 0.0, 1.0]))


def test_sum_normalisation_is_not_a_distribution_for_negative_scores() -> None:
    weights = normalize_by_sum(torch.tensor([2.0, -1.0]))
    assert_close(weights.sum(), torch.tensor(1.0))
    assert (weights < 0).any()  # why the chapter moves on to softmax


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.floats(-1e4, 1e4, allow_nan=False, width=32),
        min_size=1,
        max_size=16,
    )
)
def test_stable_softmax_equals_torch_softmax(values: list[float]) -> None:
    x = torch.tensor(values)
    w = softmax_stable(x)
    assert torch.isfinite(w).all()
    assert_close(w, torch.softmax(x, dim=-1))
    assert_close(w.sum(), torch.tensor(1.0))
