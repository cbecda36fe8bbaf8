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
from attention_bench import live, measuring
from attention_bench.__main__ import main
from attention_bench.results import SCHEMA_VERSION
from attention_bench.targets import DECODE_READ_FRACTION
from attention_site import performance as report

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


@pytest.mark.slow(seconds=10)
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
    capped = [r for r in skipped if r["experiment"] != "decode"]
    assert all(r["num_tokens"] > cfg.max_explicit_tokens and r["skipped"] for r in capped)
    for row in measured:
        assert row["q1_s"] <= row["median_s"] <= row["q3_s"]
        assert row["runs"] == len(row["times_s"]) >= cfg.min_repeats
        if row["impl"] == bench.REFERENCE:
            assert row["ratio_to_reference"] == 1.0
        if row["impl"] != "matmul" and row["experiment"] in ("gpt2", "sweep", "compile"):
            assert row["peak_bytes"] > 0 and row["state_bytes"] > 0
    # Generation: a row per batch, and the bandwidth limit from the bytes of the weights.
    decode = [r for r in measured if r["experiment"] == "decode" and r["impl"] == "gpt2_124m"]
    assert [r["batch"] for r in decode] == [1, 8]
    hf = [r for r in rows if r["experiment"] == "decode" and r["impl"] == "hf_gpt2"]
    assert [r["batch"] for r in hf] == [1, 8]  # measured, or skipped without transformers
    for row in decode + [r for r in hf if "skipped" not in r]:
        assert row["generate_s"] > 0 and row["prefill_s"] > 0 and row["runs"] >= 2 * 8
        assert row["limit_tokens_per_s"] < row["limit_read_tokens_per_s"]  # the table is indexed
        assert row["limit_tokens_per_s"] == pytest.approx(
            row["batch"] * row["read_bytes_per_s"] / (row["weights_bytes"] + row["cache_bytes"])
        )
        assert row["cached_tokens_per_s"] > 0
        assert row["impl"] == "hf_gpt2" or row["generation_speedup"] > 0
    # A padded batch: ours together and one by one (the same tokens), and HF's batch if it is here
    padded = {(r["impl"], r["way"]): r for r in measured if r["experiment"] == "padded_batch"}
    ours = padded[("gpt2_124m", "padded_batch")]
    assert ours["lengths"] == list(cfg.batched_lengths) and ours["same_tokens_as_alone"]
    assert ours["time_per_token_vs_one_by_one"] == pytest.approx(
        ours["median_s"] / padded[("gpt2_124m", "one_by_one")]["median_s"]
    )
    assert (("hf_gpt2", "padded_batch") in padded) == ("skipped" not in hf[0])
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
        "batch-1 decode, fraction of the weights-read limit",
        f"padded batch of prompts of {', '.join(map(str, cfg.batched_lengths))} tokens, time vs one by one",
    }
    names = {t["target"] for t in results["targets"]}
    vs_hf = {"batch-1 decode tokens/s vs HF GPT-2", "batch-8 decode tokens/s vs HF GPT-2",
             "batch-1 prefill time vs HF GPT-2"}  # fmt: skip
    if "skipped" in hf[0]:  # no transformers: the comparisons are left out, not failed
        assert not names & vs_hf
    else:
        assert vs_hf <= names
        assert decode[0]["decode_speed_vs_hf"] == pytest.approx(
            decode[0]["cached_tokens_per_s"] / hf[0]["cached_tokens_per_s"]
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_cuda_fails_clearly() -> None:
    with pytest.raises(SystemExit, match="CUDA is not available"):
        main(["--device", "cuda", "--quick"])


@pytest.mark.slow(seconds=5)
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
    padded = report.padded_batch_table(res)
    assert "| ours, one padded batch |" in padded and "| 1.00x |" in padded
    assert padded.endswith("wrote the same tokens as the prompts one by one.")
    assert "predates" in report.padded_batch_table({**res, "results": []})


def test_live_comparison_times_each_implementation() -> None:
    shape = bench.Shape(batch=1, num_tokens=32, d_model=16, num_heads=2)
    timings = bench.compare(shape, ["sdpa_reference", "production"], budget_s=0.05)
    assert list(timings) == ["sdpa_reference", "production"]
    assert all(len(t.times_s) >= 5 for t in timings.values())
    lines = live.compare_table(timings).splitlines()
    assert lines[1].split()[-2:] == ["1.00x", "-"] and len(lines) == 3  # header, one row each


def test_grouped_heads_flops_match_counted_matmuls() -> None:
    # One key/value head of width D // H: W_k and W_v shrink, the attention products do not.
    mha = MultiHeadAttention(D, D, T, 0.0, H, qkv_bias=True, num_kv_heads=1)
    counted = _counted_flops(lambda x: mha(x, need_weights=True), torch.randn(B, T, D), False)
    assert counted == bench.attention_flops(B, T, D, D, causal=False, d_kv=D // H)
    assert counted < bench.attention_flops(B, T, D, D, causal=False)


@pytest.mark.parametrize("window", [1, 3, 8, T, 2 * T])
def test_window_flops_count_the_band_like_the_causal_triangle(window: int) -> None:
    from attention import causal_mask

    projections, _ = bench.flop_terms(B, T, D, D)
    _, band = bench.flop_terms(B, T, D, D, window=window)
    pairs = int(causal_mask(T, window=window).sum())  # the (query, key) pairs it may see
    # 4 d_out FLOPs a pair; the diagonal counts half, as in the causal triangle's T^2 / 2
    assert band == 4 * B * D * pairs - 2 * B * D * T
    assert bench.attention_flops(B, T, D, D, window=window) == projections + band
    if window >= T:
        assert band == bench.flop_terms(B, T, D, D)[1]  # no window at all


def test_flop_terms_reject_a_window_without_causality() -> None:
    with pytest.raises(ValueError, match="window=4 needs causal=True"):
        bench.flop_terms(B, T, D, D, causal=False, window=4)
    with pytest.raises(ValueError, match="d_kv must be a positive int, got 0"):
        bench.flop_terms(B, T, D, D, d_kv=0)


def _row(experiment: str, impl: str, mode: str, median_s: float, **fields: Any) -> dict[str, Any]:
    shape = {"batch": 8, "num_tokens": 1024, "d_model": 768, "num_heads": 12}
    return {"experiment": experiment, "impl": impl, "mode": mode, "dtype": "float32",
            "median_s": median_s, "q1_s": median_s, "q3_s": median_s, "runs": 5,
            **shape, **fields}  # fmt: skip


def _document() -> dict[str, Any]:
    """A small results document with known numbers: what the report must print from it."""
    rows = [_row("gpt2", name, mode, s * (3 if mode == "forward_backward" else 1),
                 ratio_to_reference=s / 0.5, matmul_fraction=0.9)
            for name, s in (("sdpa_reference", 0.5), ("production", 0.5), ("production_gqa", 0.4))
            for mode in ("forward", "forward_backward")]  # fmt: skip
    for T_ in (256, 512, 1024):
        sweep = {"batch": 1, "num_tokens": T_}
        gqa_time = 1.2 if T_ == 1024 else 0.8  # slower than MHA at the longest context only
        for name, time_s, peak in (
            ("sdpa_reference", 1.0, 100), ("production", 1.0, 100),
            ("production_gqa", gqa_time, 70), ("production_window", 0.5, 170 if T_ > 256 else 100),
        ):  # fmt: skip
            for mode in ("forward", "forward_backward"):
                rows.append(_row("sweep", name, mode, time_s, peak_bytes=peak, state_bytes=1,
                                 **sweep))  # fmt: skip
    for batch, frac, read in ((1, 0.52, 0.40), (8, 0.25, 0.20)):
        rows.append({"experiment": "decode", "impl": "gpt2_124m", "mode": "decode",
                     "batch": batch, "num_tokens": 256, "new_tokens": 32, "prefill_s": 0.5, "cached_tokens_per_s": 20.0 * batch,
                     "uncached_tokens_per_s": 2.0, "generation_speedup": 8.0,
                     "limit_tokens_per_s": 40.0 * batch, "fraction_of_limit": frac,
                     "limit_read_tokens_per_s": 50.0 * batch, "fraction_of_read_limit": read,
                     "generate_s": 2.0 * batch})  # fmt: skip
        rows.append({"experiment": "decode", "impl": "hf_gpt2", "mode": "decode",
                     "batch": batch, "prefill_s": 0.4, "cached_tokens_per_s": 16.0 * batch,
                     "generate_s": 2.5 * batch, "fraction_of_read_limit": read * 0.8,
                     "transformers": "9.9.9"})  # fmt: skip
    for name, s in (("production", 0.4), ("production_compiled", 0.3)):
        rows.append(_row("compile", name, "forward", s, ratio_to_eager=s / 0.4))
    target = {"target": "batch-1 decode, fraction of the bandwidth limit", "value": 0.52,
              "limit": 0.5, "at_least": True, "met": True, "what": "..."}  # fmt: skip
    return {
        "date": "2026-01-01T00:00:00", "machine": {"label": "test machine", "device": "cpu"},
        "config": {"gpt2": {"batch": 8, "num_tokens": 1024, "d_model": 768, "num_heads": 12},
                   "sweep_batch": 1, "sweep_tokens": [256, 512, 1024], "decode_tokens": [256, 32]},
        "matmul_flops_per_s": {"float32": 1e11}, "targets": [target], "results": rows,
    }  # fmt: skip


def test_report_counts_each_variants_own_flops() -> None:
    res = _document()
    row = next(report.select(res, impl="production_gqa", mode="forward_backward"))
    shape = bench.Shape(8, 1024, 768, 12)
    own = bench.attention_flops(8, 1024, 768, 768, d_kv=768 // 4, backward=True)
    assert report.matmul_fraction(res, row) == pytest.approx(own / row["median_s"] / 1e11)
    full = bench.attention_flops(8, 1024, 768, 768, backward=True)
    assert report.matmul_fraction(res, row) == pytest.approx(0.719 * full / 1.2 / 1e11, rel=1e-3)
    gqa_impl = next(i for i in bench.implementations(0) if i.name == "production_gqa")
    assert gqa_impl.flops(shape, backward=True) == own
    table = report.gpt2_table(res)
    assert f"| {100 * own / 1.2 / 1e11:.0f}% |" in table  # not the stored 90%
    assert "| `production` | 500 ms, 1.00x | 1500 ms, 1.00x |" in table


def test_report_headings_state_each_tables_shape() -> None:
    res = _document()
    assert report.heading(res).endswith("batch=8, num_tokens=1024, d_model=768, num_heads=12")
    assert "batch=1, num_tokens=256 to 1024" in report.heading(res, "sweep")
    assert "forward, batch=1, num_tokens=1024," in report.heading(res, "memory")
    assert "124M GPT, batch 1 and 8, prompt 256 tokens, 32 new" in report.heading(res, "decode")


def test_report_memory_column_is_over_production_for_every_row() -> None:
    table = report.memory_table(_document())
    assert "peak over `production`'s" in table and "over unpadded" not in table
    assert "| `production_window` | 0.0 MiB | 0.0 MiB | 1.70x |" in table
    assert "| `production_gqa` | 0.0 MiB | 0.0 MiB | 0.70x |" in table


def test_report_variants_summary_says_what_the_rows_show(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "WINDOW", 256)  # the document's window: T >= 2w = 512 in reach
    text = report.variants_summary(_document())
    assert "grouped heads take 0.80x to 1.20x" in text
    assert "*slower* than multi-head attention at $T$ = 1,024 (1.20x)" in text
    assert (
        "1.70x to 1.70x multi-head attention's peak forward memory at every $T \\ge 2w$ = 512"
        in text
    )
    assert "takes 0.50x its forward+backward time at $T$ = 1,024" in text


def test_report_decode_tables_fit_and_name_both_limits() -> None:
    res = _document()
    for table in (report.decode_table(res), report.bandwidth_table(res)):
        assert table.splitlines()[0].count("|") - 1 <= 6  # columns that fit a 1280 px page
    assert "(tokens/s)" in report.bandwidth_table(res)
    note = report.decode_limits(res)
    assert "50% of the *all-weights* limit (40.0 tokens/s)" in note
    assert "weights-read* limit (50.0 tokens/s)" in note and "it reaches 40%" in note
    assert note.endswith("it reaches 40%.")  # no weights-read target in this document
    read_target = {"target": DECODE_READ_FRACTION, "value": 0.4, "limit": 0.6,
                   "met": False, "at_least": True}  # fmt: skip
    with_read = {**res, "targets": [*res["targets"], read_target]}
    assert report.decode_limits(with_read).endswith("40%, short of the 60% its own target asks.")
    assert "of the weights-read limit: 0.40" in report.targets_table(res)


def test_report_compile_table_says_where_its_eager_time_comes_from() -> None:
    table = report.compile_table(_document())
    assert "500 ms there (forward, forward+backward) against 400 ms here" in table


def test_report_gives_every_implementation_its_own_look_in_every_figure() -> None:
    looks = [tuple(sorted(style.items())) for style in report.STYLES.values()]
    assert set(report.IMPLS) == set(report.STYLES) and len(set(looks)) == len(looks)
    res = _document()
    seen: dict[str, tuple[object, ...]] = {}
    for fig in report.sweep_figures(res):
        for line in fig.axes[0].lines:
            look = (line.get_color(), line.get_marker(), line.get_linestyle())
            assert seen.setdefault(line.get_label(), look) == look  # the same in every figure


def test_live_comparison_shows_quartiles_rounds_and_the_stored_ratio() -> None:
    from attention_bench import live
    from attention_bench.measuring import Timing

    timings = {"sdpa_reference": Timing([1.0, 1.0, 1.0]), "production": Timing([1.2, 1.3, 1.4])}
    res = _document()
    shape = bench.Shape(batch=1, num_tokens=512, d_model=768, num_heads=12)
    lines = live.compare_table(timings, shape=shape, stored=res).splitlines()
    assert lines[0].split()[-1] == "stored"
    assert " ".join(lines[2].split()) == "production 1300 ms 1250-1350 ms 3 1.30x 1.00x"
    missing = live.compare_table(timings, shape=bench.Shape(1, 64, 8, 2), stored=res)
    assert missing.splitlines()[1].endswith(" -")  # the stored run has no such shape
    assert "slower than: sdpa_reference" in live.live_verdict(timings, "production")
    verdict = live.live_verdict(timings, "production", shape=shape, stored=res)
    assert verdict.endswith(
        "in the stored run, at this shape:\n  within the spread of: sdpa_reference"
    )
    assert live.live_conditions(timings).startswith("3 rounds each, load average")


def _without_hf(res: dict[str, Any]) -> dict[str, Any]:
    """`res` as a run before the comparison, or without transformers, wrote it."""
    rows = [r for r in res["results"] if r["impl"] != "hf_gpt2"]
    return {**res, "results": [{k: v for k, v in r.items() if k != "generate_s"} for r in rows]}


def test_report_hf_table_puts_ours_next_to_hugging_faces() -> None:
    res = _document()
    table = report.hf_table(res)
    assert table.splitlines()[0] == "| | ours | HF GPT-2 (transformers 9.9.9) | ours / HF |"
    assert "| prefill, batch 1 | 500 ms | 400 ms | 1.25x |" in table
    assert "| decode (tokens/s), batch 8 | 160.0 | 128.0 | 1.25x |" in table
    assert "| generation, batch 8 | 16.00 s | 20.00 s | 0.80x |" in table
    assert "| decode, batch 1: of the weights-read limit | 40% | 32% | |" in table
    # the other decode tables and the heading keep to our rows
    assert (
        report.decode_table(res).count("\n") == 3 and report.bandwidth_table(res).count("\n") == 3
    )
    assert "batch 1 and 8," in report.heading(res, "decode")


def test_report_graph_table_puts_the_graphed_step_beside_eager_and_hf() -> None:
    impls = ("gpt2_124m", "gpt2_124m_graph", "hf_gpt2")
    base = {"experiment": "decode", "batch": 1, "fraction_of_limit": 0.09}
    rows = [{**base, "impl": impl, "dtype": dtype, "cached_tokens_per_s": rate}
            for dtype, rates in (("float32", (250, 1000, 200)), ("float16", (300, 1500, 190)))
            for impl, rate in zip(impls, rates, strict=True)]  # fmt: skip
    table = report.graph_table({"results": rows})
    assert "| float16, batch 1 | 300 | 1500 | 190 | 7.89x | 9% |" in table.splitlines()
    assert table.count("\n") == 3
    assert report.graph_table(_document()) == ""  # a CPU run: no graphed rows


def test_report_draws_a_run_without_hugging_faces_rows() -> None:
    res = _without_hf(_document())
    assert "no Hugging Face rows" in report.hf_table(res)
    assert report.decode_table(res).count("\n") == 3
    assert "weights-read* limit (50.0 tokens/s)" in report.decode_limits(res)


def test_committed_results_draw_every_table() -> None:
    # The committed files may predate a row or a column: the page must still build from them.
    docs = bench.load_results()
    assert docs, "no committed results file"
    for res in docs:
        for draw in (report.gpt2_table, report.memory_table, report.decode_table,
                     report.bandwidth_table, report.decode_limits, report.targets_table,
                     report.hf_table, report.compile_table, report.variants_table):  # fmt: skip
            assert isinstance(draw(res), str)
        assert report.heading(res, "decode")


def test_mha_comparison_judges_both_calls_against_the_targets_limit() -> None:
    target = {"target": "fwd+bwd time vs torch.nn.MultiheadAttention (GPT-2 shape)",
              "limit": 0.85}  # fmt: skip
    rows = [{"experiment": "gpt2", "mode": "forward_backward", "dtype": "float32",
             "impl": impl, "median_s": s}
            for impl, s in (("production", 0.674), ("torch_mha", 0.788),
                            ("torch_mha_weights", 1.569))]  # fmt: skip
    lines = report.mha_comparison({"targets": [target], "results": rows}).splitlines()
    assert lines[0] == "need_weights=True:  674 ms / 1569 ms = 0.430, met (<= 0.85)"
    assert lines[1] == "need_weights=False: 674 ms / 788 ms = 0.855, MISSED (<= 0.85)"
    assert "not measured" in report.mha_comparison({"targets": [], "results": rows})


@pytest.mark.parametrize(
    ("content", "message"),
    [(b'{"schema": ', r"cpu\.json is not a valid JSON file \(truncated or corrupted\): Expecting"),
     (b"\xff", r"cpu\.json is not a valid JSON file .*can't decode byte 0xff"),
     (b"[1]", r"cpu\.json must hold a JSON object, got a list")],
    ids=["truncated", "not utf-8", "a list"],
)  # fmt: skip
def test_a_broken_results_file_is_named(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "cpu.json").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        bench.load_results(tmp_path)


def test_targets_compare_with_hugging_face_only_where_it_was_measured() -> None:
    from attention_bench.targets import check_targets

    res = _document()
    targets = {t["target"]: t for t in check_targets(res["results"], "float32", "float32", [256])}
    assert targets["batch-1 decode tokens/s vs HF GPT-2"]["value"] == pytest.approx(1.25)
    assert targets["batch-1 decode tokens/s vs HF GPT-2"]["met"] is False  # 1.25 < 1.3
    assert targets["batch-8 decode tokens/s vs HF GPT-2"]["met"] is True  # 1.25 >= 1.0
    assert targets["batch-1 prefill time vs HF GPT-2"]["value"] == pytest.approx(1.25)
    assert targets["batch-1 decode, fraction of the weights-read limit"]["value"] == 0.40
    without = check_targets(_without_hf(res)["results"], "float32", "float32", [256])
    assert not [t for t in without if "HF" in t["target"]]
    assert len(without) == len(targets) - 3


def test_a_transformers_older_than_the_pin_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """5.17 names the cache `past_key_values`: the bench says which version it needs."""
    from attention_bench import hf

    monkeypatch.setattr(hf.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(hf, "version", lambda: "5.17.0")
    assert hf.missing() == ("transformers 5.17.0 is older than 5.24, which this bench needs "
                            "(pip install -e '.[bench]' pins 5.24.0)")  # fmt: skip
    monkeypatch.setattr(hf, "version", lambda: "5.24.0.dev0")
    assert hf.missing() is None and hf.available()


def test_decode_without_transformers_records_the_comparison_as_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attention_bench import decode
    from attention_bench.targets import check_targets

    monkeypatch.setattr(decode.hf_gpt2, "missing", lambda: "transformers is not installed")
    cfg = bench.Config.quick("cpu")
    rows = decode.decode_rows(
        bench.Device("cpu"), 0, cfg.decode_model, 8, 4, roof_bytes=cfg.roof_bytes
    )
    assert [(r["impl"], r["batch"], "skipped" in r) for r in rows] == [
        ("gpt2_124m", 1, False), ("hf_gpt2", 1, True), ("gpt2_124m", 8, False), ("hf_gpt2", 8, True),
    ]  # fmt: skip
    assert "transformers is not installed" in rows[1]["skipped"]
    assert "decode_speed_vs_hf" not in rows[0]
    names = [t["target"] for t in check_targets(rows, "float32", "float32", [8])]
    assert "batch-1 decode, fraction of the weights-read limit" in names
    assert not [name for name in names if "HF" in name]


def test_the_roof_measures_reading_apart_and_a_step_outlasts_its_products() -> None:
    """The read bandwidth is measured apart from the copy's; a decode step's products alone
    take less time than the whole step, which runs them and more."""
    from attention.model.gpt import GPTModel
    from attention_bench.decode import step_parts

    roof = bench.roof(budget_s=0.1, nbytes=2**24)  # 16 MiB: the arithmetic, not the rate
    assert roof.read_bytes_per_s > 0 and roof.bytes_per_s > 0 and roof.ridge > 0
    cfg = {"vocab_size": 64, "context_length": 24, "emb_dim": 32, "n_heads": 4,
           "n_layers": 2, "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip
    parts = step_parts(GPTModel(cfg).eval(), prompt_tokens=16)
    assert 0 < parts["products_s"] < parts["step_s"]


def test_the_long_window_targets_need_flexattentions_core_and_judge_ratios() -> None:
    from attention_bench.targets import check_targets

    def row(impl: str, seconds: float) -> dict[str, Any]:
        return {"experiment": "window", "impl": impl, "num_tokens": 32768, "window": 1024,
                "median_s": seconds}  # fmt: skip

    cpu = [row("causal", 5.0), row("window", 6.0), row("projections", 0.4)]
    assert check_targets(cpu, "float32", "float32", (128,)) == []  # no core: no target
    cuda = [*cpu[:1], row("window", 0.9), row("projections", 0.38), row("flex_core", 0.47)]
    speedup, vs_core = check_targets(cuda, "bfloat16", "float16", (128,))
    assert speedup["value"] == pytest.approx(5.0 / 0.9) and speedup["met"]
    assert vs_core["value"] == pytest.approx(0.9 / 0.85) and vs_core["met"]
