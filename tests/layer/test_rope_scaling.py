"""RoPE scaling and partial rotation: each method's frequencies equal transformers' own.

transformers computes its frequencies in float32; `float64_casts` (tests/float64.py) points
its `torch.float` and `torch.float32` at float64 while it runs, so both sides evaluate the same
formulas in float64 and agree to rounding (1e-12).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
import torch

from attention.layer.multihead import MultiHeadAttention
from attention.layer.positions import RotaryTable, apply_rope, rope_angles
from attention.layer.rope_scaling import RopeScaling
from tests.float64 import float64_casts

HEAD_DIM, CONTEXT = 16, 256

CASES: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32},
    "yarn, DeepSeek's mscale, untruncated": {
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 16, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "partial, default": {"rope_type": "default", "partial_rotary_factor": 0.5},
    "partial, yarn": {"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 64, "partial_rotary_factor": 0.75},
}  # fmt: skip


@pytest.fixture
def transformers() -> ModuleType:
    return pytest.importorskip("transformers", minversion="5.24")


def theirs(transformers: ModuleType, parameters: dict[str, Any],
           seq_len: int | None = None) -> tuple[torch.Tensor, float]:  # fmt: skip
    """transformers' `ROPE_INIT_FUNCTIONS[rope_type]` (or its default) for a Llama config."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_theta": 10000.0, **parameters}
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=HEAD_DIM,
                                      max_position_embeddings=CONTEXT, rope_parameters=rope)  # fmt: skip
    kind = rope["rope_type"]
    with float64_casts():
        if kind == "default":  # its partial rotation is read by the init functions only
            config.rope_parameters = {**rope, "rope_type": "linear", "factor": 1.0}
            kind = "linear"
        inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    return inv_freq, factor


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_equal_transformers(transformers: ModuleType, case: str) -> None:
    parameters = CASES[case]
    theta, factor = RopeScaling.from_parameters(parameters, CONTEXT).frequencies(HEAD_DIM, 1e4)
    inv_freq, their_factor = theirs(transformers, parameters)
    assert inv_freq.dtype == torch.float64  # the casts were patched out
    torch.testing.assert_close(theta, inv_freq, rtol=1e-12, atol=0)
    assert math.isclose(factor, their_factor, rel_tol=1e-12)


def test_yarn_changes_slow_pairs_and_keeps_fast_ones() -> None:
    scaling = RopeScaling.from_parameters(CASES["yarn"], CONTEXT)
    theta, factor = scaling.frequencies(HEAD_DIM, 1e4)
    plain = 1e4 ** -(torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    ratio = theta / plain
    assert ratio[0] == pytest.approx(1.0) and ratio[-1] == pytest.approx(1 / 8)
    assert bool((ratio[1:] <= ratio[:-1] + 1e-15).all())  # monotone between the two
    assert factor == pytest.approx(0.1 * math.log(8) + 1)


def test_dynamic_grows_its_base_past_the_context(transformers: ModuleType) -> None:
    scaling = RopeScaling.from_parameters(CASES["dynamic"], CONTEXT)
    plain, _ = scaling.frequencies(HEAD_DIM, 1e4)
    longer, _ = scaling.frequencies(HEAD_DIM, 1e4, seq_len=3 * CONTEXT)
    torch.testing.assert_close(longer, theirs(transformers, CASES["dynamic"], 3 * CONTEXT)[0],
                               rtol=1e-12, atol=0)  # fmt: skip
    assert float(longer[0]) == pytest.approx(1.0) and float(longer[-1]) < float(plain[-1])


def test_the_table_rotates_with_scaled_frequencies_and_factor() -> None:
    scaling = RopeScaling.from_parameters(CASES["yarn"], CONTEXT)
    theta, factor = scaling.frequencies(HEAD_DIM, 1e4)
    table = RotaryTable(HEAD_DIM, 1e4, scaling=scaling)
    cos, sin = table.angles(5, 3, torch.device("cpu"), torch.float64)
    angles = torch.arange(5, 8, dtype=torch.float64)[:, None] * theta
    torch.testing.assert_close(sin[:, : HEAD_DIM // 2], angles.sin() * factor, rtol=0,
                               atol=1e-15)  # fmt: skip
    torch.testing.assert_close(cos[:, HEAD_DIM // 2 :], angles.cos() * factor, rtol=0,
                               atol=1e-15)  # fmt: skip
    far = table.at(0, 3, torch.tensor([[5, 6, 7]]), torch.device("cpu"), torch.float64)
    torch.testing.assert_close(far[1][0, 0], sin, rtol=0, atol=1e-15)


def test_partial_rotation_turns_the_first_dimensions_only() -> None:
    scaling = RopeScaling.from_parameters(CASES["partial, default"])
    table = RotaryTable(HEAD_DIM, 1e4, scaling=scaling)
    assert table.dim == HEAD_DIM // 2
    x = torch.randn(1, 2, 5, HEAD_DIM, dtype=torch.float64)
    turned = table.rotate(x, start=3)
    torch.testing.assert_close(turned[..., 8:], x[..., 8:], rtol=0, atol=0)
    plain = apply_rope(x[..., :8], *rope_angles(5, 8, 1e4, offset=3, dtype=torch.float64))
    torch.testing.assert_close(turned[..., :8], plain, rtol=0, atol=1e-14)


def test_the_layer_takes_a_config_dict_and_records_it() -> None:
    att = MultiHeadAttention(64, 64, 64, 0.0, num_heads=4, rope=True,
                             rope_scaling=CASES["llama3"])  # fmt: skip
    assert att.spec.rope_scaling == RopeScaling.from_parameters(CASES["llama3"])
    assert "rope_scaling=llama3" in repr(att)
    assert any(item.startswith("rope_scaling=") for item in att.spec.unsupported())


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"rope_type": "longrope", "factor": 2.0}, "rope_type='longrope'"),
        ({"rope_type": "linear", "factor": 2.0, "beta_fast": 3}, "beta_fast=3"),
        ({"rope_type": "llama3", "factor": 8.0}, "original_max_position_embeddings"),
        ({"rope_type": "linear", "factor": -1.0}, "factor"),
        ({"partial_rotary_factor": 0.1}, "rotates 1 dimensions"),
    ],
)
def test_what_it_cannot_compute_is_refused_by_name(parameters: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        MultiHeadAttention(64, 64, 64, 0.0, num_heads=4, rope=True, rope_scaling=parameters)


def test_scaling_needs_rope_and_dynamic_a_context_within_its_own() -> None:
    with pytest.raises(ValueError, match="needs rope=True"):
        MultiHeadAttention(64, 64, 64, 0.0, num_heads=4, rope_scaling=CASES["linear"])
    dynamic = RopeScaling.from_parameters(CASES["dynamic"], 32)
    with pytest.raises(ValueError, match="context_length=64 must not exceed"):
        MultiHeadAttention(64, 64, 64, 0.0, num_heads=4, rope=True, rope_scaling=dynamic)
