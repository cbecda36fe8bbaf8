"""The benchmark harness (`attention_bench`): its FLOP count, memory meter, output, report.

No timing is asserted: the numbers belong to the machine; what is tested is how they are made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

import attention_bench as bench
from attention import MultiHeadAttention, MultiHeadAttentionWrapper
from attention_bench import measuring, report
from attention_bench.__main__ import main
from attention_bench.results import SCHEMA_VERSION

B, T, D, H = 2, 16, 24, 3


def _counted_flops(module: Callable[[torch.Tensor], Any], x: torch.Tensor, backward: bool) -> int:
    """FLOPs of the matmuls that torch dispatches (2mkn each), by FlopCounterMode."""
    with FlopCounterMode(display=False) as counter:
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        if backward:
            out.sum().backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("backward", [False, True])
def test_flops_match_counted_matmuls_of_explicit_path(backward: bool) -> None:
    # The explicit path multiplies the full T x T matrices (masking only afterwards), so it
    # does exactly the non-causal count; the causal count is half of the T^2 products.
    mha = MultiHeadAttention(D, D, T, 0.0, H, qkv_bias=True)
    x = torch.randn(B, T, D, requires_grad=True)
    counted = _counted_flops(lambda x: mha(x, need_weights=True), x, backward)
    assert counted == bench.attention_flops(B, T, D, D, causal=False, backward=backward)


def test_flops_wrapper_has_no_output_projection() -> None:
    wrapper = MultiHeadAttentionWrapper(D, D // H, T, 0.0, H, qkv_bias=True)
    counted = _counted_flops(wrapper, torch.randn(B, T, D), backward=False)
    assert counted == bench.attention_flops(B, T, D, D, causal=False, out_proj=False)


def test_causal_flops_halve_the_attention_products() -> None:
    full = bench.attention_flops(B, T, D, D, causal=False)
    causal = bench.attention_flops(B, T, D, D, causal=True)
    assert full - causal == 2 * B * T * T * D  # half of 4 b T^2 d_out


def test_cpu_peak_bytes_is_the_running_maximum() -> None:
    def allocate() -> torch.Tensor:
        a = torch.empty(2**18)  # 1 MiB
        b = torch.empty(2**19)  # 2 MiB: 3 MiB alive, the peak
        del a  # 2 MiB alive
        c = torch.empty(2**17)  # 0.5 MiB: 2.5 MiB alive
        del c
        return b

    peak, result = bench.Device("cpu").peak_bytes(allocate)
    assert peak == 3 * 2**20
    assert result.shape == (2**19,)
    # The public fallback (per-operator net bytes) agrees where no operator hides a temporary.
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        allocate()
    allocated = peak = 0
    for _, nbytes in sorted(measuring._allocations_by_operator(prof)):
        allocated += nbytes
        peak = max(peak, allocated)
    assert peak == 3 * 2**20


def test_reference_module_equals_production_fused_path() -> None:
    # Same weights, same math: the reference is a fair yardstick for the production module.
    torch.manual_seed(0)
    shape = bench.Shape(B, T, D, H)
    production = bench.implementations(T)[1].build(shape)
    reference = bench.SDPAReference(D, D, H)
    reference.load_state_dict(production.state_dict(), strict=False)
    x = torch.randn(B, T, D)
    torch.testing.assert_close(reference(x), production(x), atol=1e-5, rtol=1e-5)


def test_every_implementation_computes_the_same_attention() -> None:
    # The adapters (need_weights, padding, nn.MultiheadAttention) return (b, T, d_out).
    shape = bench.Shape(B, T, D, H)
    for impl in bench.implementations(T):
        out = impl.build(shape)(torch.randn(B, T, D))
        assert out.shape == (B, T, D), impl.name


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_forced_sdpa_backend_computes_the_same(backend: str) -> None:
    # The CUDA runs force one SDPA backend at a time; the plumbing is the same on the CPU,
    # which has a math and a flash kernel.
    shape = bench.Shape(B, T, D, H)
    reference = bench.implementations(T)[0].build(shape)
    x, grad_out = torch.randn(B, T, D), torch.randn(B, T, D)
    default = bench.make_step(reference, x, "forward", grad_out, None)()
    forced = bench.make_step(reference, x, "forward", grad_out, backend)()
    torch.testing.assert_close(forced, default, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_quick_run_writes_complete_results(tmp_path: Path) -> None:
    out = main(["--quick", "--no-compile", "--out", str(tmp_path / "r.json")])
    results = json.loads(out.read_text())

    assert results["schema"] == SCHEMA_VERSION
    assert {"cpu", "torch", "torch_threads", "slug", "label"} <= results["machine"].keys()
    assert results["machine"]["torch"] == torch.__version__
    assert all(len(s["loadavg"]) == 3 for s in results["load_average"])
    cfg = bench.Config.quick("cpu")
    names = {impl.name for impl in bench.implementations(cfg.max_explicit_tokens)}
    rows = results["results"]
    for experiment, shapes in (("gpt2", [cfg.gpt2.num_tokens]), ("sweep", cfg.sweep_tokens)):
        for num_tokens in shapes:
            at = (experiment, num_tokens)
            seen = {r["impl"] for r in rows if (r["experiment"], r["num_tokens"]) == at}
            assert names <= seen, (experiment, num_tokens, names - seen)
    measured = [r for r in rows if "skipped" not in r]
    skipped = [r for r in rows if "skipped" in r]
    # The explicit paths are capped at max_explicit_tokens, with the reason recorded.
    assert {r["impl"] for r in skipped} >= {"explicit", "wrapper", "torch_mha_weights"}
    assert all(r["num_tokens"] > cfg.max_explicit_tokens and r["skipped"] for r in skipped)
    for row in measured:
        assert row["q1_s"] <= row["median_s"] <= row["q3_s"]
        assert row["runs"] == len(row["times_s"]) >= cfg.min_repeats
        if row["impl"] == bench.REFERENCE:
            assert row["ratio_to_reference"] == 1.0
        if row["impl"] != "matmul" and row["experiment"] not in ("construct", "decode"):
            assert row["peak_bytes"] > 0 and row["state_bytes"] > 0
    # Generation: a row per batch, and the bandwidth limit from the bytes of the weights.
    decode = [r for r in measured if r["experiment"] == "decode"]
    assert [r["batch"] for r in decode] == [1, 8]
    for row in decode:
        assert row["limit_tokens_per_s"] < row["limit_read_tokens_per_s"]  # the table is indexed
        assert row["limit_tokens_per_s"] == pytest.approx(
            row["batch"] * row["copy_bytes_per_s"] / (row["weights_bytes"] + row["cache_bytes"])
        )
        assert row["cached_tokens_per_s"] > 0 and row["generation_speedup"] > 0
    # Construction at a long context: the state is the four projections' parameters only.
    (construct,) = [r for r in measured if r["experiment"] == "construct"]
    d = cfg.gpt2.d_model
    assert construct["context_length"] == cfg.construct_context_length
    assert construct["state_bytes"] == 4 * (4 * d * d + d)  # W_q, W_k, W_v, W_o and b_o
    # The explicit path returns the (b, h, T, T) weights: the meter must see at least those.
    explicit = next(r for r in measured if r["impl"] == "explicit" and r["mode"] == "forward")
    weights_bytes = 4 * explicit["batch"] * explicit["num_heads"] * explicit["num_tokens"] ** 2
    assert explicit["peak_bytes"] >= weights_bytes
    longest = max(cfg.sweep_tokens)
    assert {t["target"].split(" (")[0] for t in results["targets"]} >= {
        "fwd+bwd time vs SDPA reference",
        "fwd+bwd time vs torch.nn.MultiheadAttention",
        f"peak forward memory at {longest} tokens, production vs SDPA reference",
        f"peak forward memory at {longest} tokens, right-padded vs unpadded",
        f"construction time at context_length={cfg.construct_context_length}",
        "batch-1 decode, fraction of the bandwidth limit",
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_fails_clearly() -> None:
    with pytest.raises(SystemExit, match="CUDA is not available"):
        main(["--device", "cuda", "--quick"])


def test_report_draws_every_table_and_figure_from_a_quick_run(tmp_path: Path) -> None:
    out = main(["--quick", "--no-compile", "--out", str(tmp_path / "r.json")])
    res = json.loads(out.read_text())
    table = report.gpt2_table(res)
    assert table.count("\n") == 1 + len(report.IMPLS)  # header, rule, one row each
    assert "| `sdpa_reference` |" in table and "1.00x" in table
    memory = report.memory_table(res)
    assert "| `production_left_padded` |" in memory and "x |" in memory
    assert report.targets_table(res).count("| met |") + report.targets_table(res).count(
        "| **missed** |"
    ) == len(res["targets"])
    assert [len(fig.axes[0].lines) > 0 for fig in report.sweep_figures(res)] == [True] * 3
    assert len(report.ratio_figure(res).axes[0].patches) >= 6
    assert report.method(res, "peak_bytes").startswith("peak_bytes: CPU: running maximum")


def test_live_comparison_times_each_implementation() -> None:
    shape = bench.Shape(batch=1, num_tokens=32, d_model=16, num_heads=2)
    timings = bench.compare(shape, ["sdpa_reference", "production"], budget_s=0.05)
    assert list(timings) == ["sdpa_reference", "production"]
    assert all(len(t.times_s) >= 5 for t in timings.values())
    lines = report.compare_table(timings).splitlines()
    assert lines[0].endswith("1.00x reference") and len(lines) == 2
