"""The experiments: the GPT-2-small shape, a context-length sweep, construction, torch.compile.

Each writes rows into a [`Recorder`][attention_bench.experiments.Recorder];
[`run`][attention_bench.experiments.run] runs them all for one
[`Config`][attention_bench.experiments.Config] and returns the results document.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attention import MultiHeadAttention
from attention_bench.batched import LENGTHS, padded_batch_rows
from attention_bench.decode import decode_rows
from attention_bench.implementations import (
    MODES,
    REFERENCE,
    Impl,
    Shape,
    cuda_backend_impls,
    implementations,
)
from attention_bench.measuring import (
    ROOF_BYTES,
    Device,
    Timing,
    make_step,
    measure,
    state_bytes,
)
from attention_bench.results import METHOD, SCHEMA_VERSION, machine
from attention_bench.targets import check_targets
from attention_bench.window import long_window_rows

__all__ = ["EXPERIMENTS", "Config", "Recorder", "compare", "run"]

EXPERIMENTS = ("gpt2", "sweep", "construct", "decode", "batched", "window", "compile")
"""Every experiment of a run, in the order it runs them."""


@dataclass
class Config:
    """The sizes and budgets of one run."""

    device: str = "cpu"
    dtypes: tuple[str, ...] = ("float32",)
    gpt2: Shape = field(
        default_factory=lambda: Shape(batch=8, num_tokens=1024, d_model=768, num_heads=12)
    )
    sweep_batch: int = 1
    sweep_tokens: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    max_explicit_tokens: int = 2048
    group_budget_s: float = 6.0
    min_repeats: int = 3
    gpt2_min_repeats: int = 5  # GPT-2 shape and compile, the headline numbers: more rounds
    max_repeats: int = 15
    compile: bool = True
    seed: int = 0
    construct_context_length: int = 131_072
    decode_model: dict[str, Any] | None = None  # None: the book's GPT-2 124M
    decode_tokens: tuple[int, int] = (256, 32)  # prompt, new
    batched_new: int = 32  # new tokens after a padded batch's prompts
    batched_lengths: tuple[int, ...] = LENGTHS  # a padded batch's prompts (new: decode_tokens)
    roof_bytes: int = ROOF_BYTES  # the buffer the bandwidths are measured over
    long_window: tuple[int, int] | None = None  # (num_tokens, window); None: the device's
    experiments: tuple[str, ...] = EXPERIMENTS  # those to run (compile also needs `compile`)

    @classmethod
    def full(cls, device: str) -> Config:
        """The committed run: float32 on the CPU; float32, float16 and bfloat16 on CUDA, where
        generation writes 256 tokens after its prompt of 256 (32 on the CPU)."""
        if device != "cuda":
            return cls(device=device)
        return cls(
            device=device, dtypes=("float32", "float16", "bfloat16"), decode_tokens=(256, 256)
        )

    @classmethod
    def quick(cls, device: str) -> Config:
        """Tiny sizes: checks the harness end to end in seconds (numbers are meaningless)."""
        return cls(
            device=device,
            gpt2=Shape(batch=2, num_tokens=64, d_model=64, num_heads=4),
            sweep_tokens=(32, 64, 128),
            max_explicit_tokens=64,
            group_budget_s=0.2,
            gpt2_min_repeats=3,
            max_repeats=3,
            compile=False,
            decode_model={
                "vocab_size": 64,
                "context_length": 48,
                "emb_dim": 32,
                "n_heads": 4,
                "n_layers": 2,
                "drop_rate": 0.0,
                "qkv_bias": False,
            },
            decode_tokens=(16, 8),
            batched_new=8,
            batched_lengths=(3, 5, 9, 20),
            roof_bytes=2**24,
            long_window=(256, 32),
        )


def _say(*parts: object) -> None:
    """Print one line of progress now: flushed, as the run takes minutes."""
    print(*parts, flush=True)


class Recorder:
    """Collects result rows and load-average samples, and prints progress."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.load: list[dict[str, Any]] = []
        self.start = time.perf_counter()
        self.sample_load("start")

    def sample_load(self, when: str) -> None:
        """Record the machine's load average: a busy machine makes every time longer."""
        one, five, fifteen = os.getloadavg()
        elapsed = round(time.perf_counter() - self.start, 1)
        self.load.append({"when": when, "elapsed_s": elapsed, "loadavg": [one, five, fifteen]})

    def add(self, row: dict[str, Any]) -> None:
        """Keep one row and print it."""
        self.rows.append(row)
        head = f"  {row['impl']:<22} {row['mode']:<16} T={row['num_tokens']:<5}"
        if "skipped" in row:
            _say(head, "skipped")
            return
        parts = [f"{1e3 * row['median_s']:9.2f} ms"]
        if row.get("ratio_to_reference") is not None:
            parts.append(f"{row['ratio_to_reference']:5.2f}x ref")
        if row.get("matmul_fraction") is not None:
            parts.append(f"{100 * row['matmul_fraction']:5.1f}% of matmul")
        if row.get("peak_bytes") is not None:
            parts.append(f"peak {row['peak_bytes'] / 2**20:8.1f} MiB")
        _say(head, "  ".join(parts))


def compare(
    shape: Shape,
    names: Sequence[str],
    *,
    mode: str = "forward_backward",
    device: Device | None = None,
    budget_s: float = 1.0,
    seed: int = 0,
) -> dict[str, Timing]:
    """Time some implementations against each other now, in one group: a live comparison.

    Args:
        shape: the input shape.
        names: implementation names (see [`implementations`][attention_bench.implementations]).
        mode: `"forward"` or `"forward_backward"`.
        device: where to run; default [`Device.from_env()`][attention_bench.measuring.Device].
        budget_s: roughly how long to spend timing.
        seed: seeds the weights and the input.

    Returns:
        `{name: Timing}`, in the order of `names`.
    """
    device = device or Device.from_env()
    impls = {impl.name: impl for impl in implementations(shape.num_tokens)}
    torch.manual_seed(seed)
    x = torch.randn(shape.batch, shape.num_tokens, shape.d_model, device=device.type)
    grad_out = torch.randn_like(x)  # (b, T, d_model)
    steps = {}
    for name in names:
        module = impls[name].build(shape).to(device.type)
        steps[name] = make_step(module, x, mode, grad_out, None)
    return measure(steps, device, budget_s=budget_s, min_repeats=5, max_repeats=15, memory=False)


def _base(experiment: str, cfg: Config, shape: Shape, dtype: str) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "device": cfg.device,
        "dtype": dtype,
        "batch": shape.batch,
        "num_tokens": shape.num_tokens,
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
    }


def run_group(
    rec: Recorder,
    cfg: Config,
    experiment: str,
    impls: Sequence[Impl],
    shape: Shape,
    dtype: str,
    *,
    with_matmul: bool,
    matmul_flops_per_s: float | None,
) -> float | None:
    """Measure `impls` (and optionally the matmul) at one shape and dtype, both modes.

    Returns the matmul's achieved FLOP/s when it was measured.
    """
    device = Device(cfg.device)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(cfg.seed)
    x = torch.randn(shape.batch, shape.num_tokens, shape.d_model)
    x = x.to(cfg.device, torch_dtype)  # (b, T, d_model)
    grad_out = torch.randn_like(x)  # (b, T, d_model)
    base = _base(experiment, cfg, shape, dtype)
    runs, modules = _build_group(rec, cfg, base, impls, shape, torch_dtype)
    matmul_result = None
    for mode in MODES:
        steps: dict[str, Callable[[], object]] = {}
        for impl in runs[mode]:
            module = modules[impl.name][1]
            steps[impl.name] = make_step(module, x, mode, grad_out, impl.backend)
        if with_matmul and mode == "forward":
            steps["matmul"] = _matmul_step(x, cfg.device, torch_dtype)
        steps = _drop_unsupported(rec, base, mode, steps)
        timings = measure(
            steps,
            device,
            budget_s=cfg.group_budget_s,
            min_repeats=cfg.gpt2_min_repeats if experiment == "gpt2" else cfg.min_repeats,
            max_repeats=cfg.max_repeats,
        )
        if "matmul" in timings:
            matmul_s = min(timings["matmul"].times_s)  # the roof: what the machine can do
            matmul_result = _matmul_flops(shape) / matmul_s
            matmul_flops_per_s = matmul_result
        for row in _group_rows(base, mode, shape, timings, modules, matmul_flops_per_s):
            rec.add(row)
    return matmul_result


def _build_group(
    rec: Recorder,
    cfg: Config,
    base: dict[str, Any],
    impls: Sequence[Impl],
    shape: Shape,
    torch_dtype: torch.dtype,
) -> tuple[dict[str, list[Impl]], dict[str, tuple[Impl, nn.Module]]]:
    """The implementations each mode runs at `shape`, and their modules, built once, seeded.

    An implementation that does not run in a mode (past `max_explicit_tokens`, say) is
    recorded as skipped there, with the reason.
    """
    modules: dict[str, tuple[Impl, nn.Module]] = {}
    runs: dict[str, list[Impl]] = {mode: [] for mode in MODES}
    for impl in impls:
        for mode in impl.modes:
            reason = impl.skipped(mode, shape)
            if reason is None:
                runs[mode].append(impl)
            else:
                rec.add({**base, "impl": impl.name, "mode": mode, "skipped": reason})
        if any(impl in runs[mode] for mode in MODES):
            torch.manual_seed(cfg.seed)
            modules[impl.name] = (impl, impl.build(shape).to(cfg.device, torch_dtype))
    return runs, modules


def _matmul_flops(shape: Shape) -> int:
    """The FLOPs of (b * T, d_model) @ (d_model, d_model), the group's roof."""
    return 2 * shape.batch * shape.num_tokens * shape.d_model**2


def _matmul_step(x: torch.Tensor, device: str, torch_dtype: torch.dtype) -> Callable[[], object]:
    """The roof's step: `x` as (b * T, d_model) times a square weight, into a ready output."""
    d_model = x.shape[-1]
    a = x.reshape(-1, d_model)  # (b * T, d_model)
    w = torch.randn(d_model, d_model, device=device, dtype=torch_dtype)
    c = torch.empty_like(a)  # (b * T, d_model): no allocation inside the timing
    return functools.partial(torch.matmul, a, w, out=c)


def _group_rows(
    base: dict[str, Any],
    mode: str,
    shape: Shape,
    timings: dict[str, Timing],
    modules: dict[str, tuple[Impl, nn.Module]],
    matmul_flops_per_s: float | None,
) -> Iterator[dict[str, Any]]:
    """A row per timing of one mode: FLOP/s, the fraction of the matmul's, the ratio to SDPA."""
    ref = timings.get(REFERENCE)
    ref_s = None if ref is None else ref.summary()["median_s"]
    for name, timing in timings.items():
        row = {**base, "impl": name, "mode": mode, **timing.summary()}
        if name == "matmul":
            row["flops"] = _matmul_flops(shape)
        else:
            impl = modules[name][0]
            row["flops"] = impl.flops(shape, backward=mode == "forward_backward")
            row["state_bytes"] = state_bytes(modules[name][1])
            row["peak_bytes"] = timing.peak_bytes
        row["flops_per_s"] = row["flops"] / row["median_s"]
        if matmul_flops_per_s:
            row["matmul_fraction"] = row["flops_per_s"] / matmul_flops_per_s
        if ref_s is not None and name != "matmul":
            row["ratio_to_reference"] = row["median_s"] / ref_s
        yield row


def _drop_unsupported(
    rec: Recorder, base: dict[str, Any], mode: str, steps: dict[str, Callable[[], object]]
) -> dict[str, Callable[[], object]]:
    """On CUDA a forced SDPA backend may not support a dtype or shape: record it as skipped."""
    if base["device"] != "cuda":
        return steps
    kept = {}
    for name, step in steps.items():
        try:
            step()
            torch.cuda.synchronize()
        except RuntimeError as err:
            reason = str(err).strip().splitlines()[0][:300]
            rec.add({**base, "impl": name, "mode": mode, "skipped": reason})
            continue
        kept[name] = step
    return kept


def run_construct(rec: Recorder, cfg: Config) -> None:
    """How long building a long-context module takes, and what it holds: no T x T buffer."""
    shape = cfg.gpt2
    times, module = [], None
    for _ in range(cfg.min_repeats):
        start = time.perf_counter()
        module = MultiHeadAttention(
            shape.d_model, shape.d_model, cfg.construct_context_length, 0.0, shape.num_heads
        )
        times.append(time.perf_counter() - start)
    assert module is not None
    base = _base("construct", cfg, Shape(1, 0, shape.d_model, shape.num_heads), "float32")
    rec.add(
        {
            **base,
            "device": "cpu",
            "impl": "production",
            "mode": "construct",
            "context_length": cfg.construct_context_length,
            "state_bytes": state_bytes(module),
            **Timing(times).summary(),
        }
    )


def run_compile(rec: Recorder, cfg: Config, dtype: str) -> None:
    """Production module eager vs `torch.compile`d, both modes, at the GPT-2 shape.

    The compiler's on-disk cache starts empty, so `first_call_s` is what a first compile
    costs (a later process with the same code and shapes would hit the cache).
    """
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="attention-bench-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            _run_compile(rec, cfg, dtype)
        finally:
            if saved is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def _run_compile(rec: Recorder, cfg: Config, dtype: str) -> None:
    torch._dynamo.reset()
    shape = cfg.gpt2
    device = Device(cfg.device)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(cfg.seed)
    x = torch.randn(shape.batch, shape.num_tokens, shape.d_model).to(cfg.device, torch_dtype)
    grad_out = torch.randn_like(x)
    eager = implementations(0)[1].build(shape).to(cfg.device, torch_dtype)  # production
    compiled: Any = torch.compile(eager)
    base = _base("compile", cfg, shape, dtype)
    for mode in MODES:
        steps = {
            "production": make_step(eager, x, mode, grad_out, None),
            "production_compiled": make_step(compiled, x, mode, grad_out, None),
        }
        start = time.perf_counter()
        steps["production_compiled"]()  # compiles
        device.sync()
        compile_s = time.perf_counter() - start
        timings = measure(
            steps,
            device,
            budget_s=cfg.group_budget_s,
            min_repeats=cfg.gpt2_min_repeats,
            max_repeats=cfg.max_repeats,
            memory=False,
        )
        eager_s = timings["production"].summary()["median_s"]
        for name, timing in timings.items():
            row = {**base, "impl": name, "mode": mode, **timing.summary()}
            row["ratio_to_eager"] = row["median_s"] / eager_s
            if name == "production_compiled":
                row["first_call_s"] = compile_s
            rec.add(row)


def run_decode(rec: Recorder, cfg: Config) -> None:
    """Generation: ours, and Hugging Face's GPT-2 on the same weights where it is installed."""
    prompt, new = cfg.decode_tokens
    _say(f"generation, prompt {prompt} tokens, {new} new")
    rows, device = [], Device(cfg.device)
    for name in cfg.dtypes:  # float32 on the CPU; and float16, bfloat16 on CUDA
        dtype = getattr(torch, name)
        rows += decode_rows(
            device, cfg.seed, cfg.decode_model, prompt, new, roof_bytes=cfg.roof_bytes, dtype=dtype
        )
    for row in rows:
        rec.rows.append(row)
        head = f"  {row['impl']:<15} {row['dtype']:<8} batch {row['batch']}:"
        if "skipped" in row:
            _say(head, "skipped:", row["skipped"])
            continue
        _say(
            f"{head} prefill {1e3 * row['prefill_s']:.1f} ms, decode "
            f"{row['cached_tokens_per_s']:.1f} tokens/s cached, generation "
            f"{row['generate_s']:.3f} s, {row['fraction_of_read_limit']:.2f} of the "
            "weights-read limit"
        )
        if "uncached_tokens_per_s" in row:
            _say(
                f"  {'':<15} {row['uncached_tokens_per_s']:.1f} tokens/s uncached, "
                f"{row['fraction_of_limit']:.2f} of the bandwidth limit"
            )
        if "decode_speed_vs_hf" in row:
            _say(
                f"  {'':<15} vs hf_gpt2: decode {row['decode_speed_vs_hf']:.2f}x as fast, "
                f"prefill {row['prefill_time_vs_hf']:.2f}x the time, generation "
                f"{row['generate_time_vs_hf']:.2f}x the time"
            )
    rec.sample_load("after generation")


def run_batched(rec: Recorder, cfg: Config) -> None:
    """A padded batch of prompts of different lengths, against the same prompts one by one."""
    new, lengths = cfg.batched_new, cfg.batched_lengths
    _say(f"padded batch, prompts of {list(lengths)} tokens, {new} new")
    rows = padded_batch_rows(Device(cfg.device), cfg.seed, cfg.decode_model, lengths, new)
    for row in rows:
        rec.rows.append(row)
        _say(f"  {row['impl']:<10} {row['way']:<13} {1e3 * row['s_per_token']:.1f} ms per token")
    batch = rows[0]
    _say(
        f"  padded batch: {batch['time_per_token_vs_one_by_one']:.2f}x the time per token of "
        f"one by one, the same tokens: {batch['same_tokens_as_alone']}"
    )
    rec.sample_load("after padded batch")


def run_window(rec: Recorder, cfg: Config) -> None:
    """A long window against causal attention, one layer (bfloat16 on CUDA)."""
    dtype = "bfloat16" if cfg.device == "cuda" else cfg.dtypes[0]
    rows = long_window_rows(Device(cfg.device), dtype, cfg.long_window)
    first = rows[0]
    _say(f"one layer, d 1024, 16 heads, T={first['num_tokens']}, window {first['window']}, {dtype}")
    for row in rows:
        rec.rows.append(row)
        _say(f"  {row['impl']:<12} {1e3 * row['median_s']:9.2f} ms")
    rec.sample_load("after window")


def run(cfg: Config) -> dict[str, Any]:
    """Run every experiment of `cfg`; return the results document."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available in this torch build/machine")
    rec = Recorder()
    impls = implementations(cfg.max_explicit_tokens)
    if cfg.device == "cuda":
        impls = impls + cuda_backend_impls()
    matmul = run_gpt2(rec, cfg, impls) if "gpt2" in cfg.experiments else {}
    sweep_dtype = cfg.dtypes[0] if cfg.device == "cpu" else "float16"
    if "sweep" in cfg.experiments:
        run_sweep(rec, cfg, impls, sweep_dtype, matmul.get(sweep_dtype))
    if "construct" in cfg.experiments:
        _say(f"construction at context_length={cfg.construct_context_length}")
        run_construct(rec, cfg)
    if "decode" in cfg.experiments:
        run_decode(rec, cfg)
    if "batched" in cfg.experiments:
        run_batched(rec, cfg)
    if "window" in cfg.experiments:
        run_window(rec, cfg)
    if cfg.compile and "compile" in cfg.experiments:
        _say("torch.compile, production module")
        run_compile(rec, cfg, cfg.dtypes[0])
        rec.sample_load("after compile")
    targets = check_targets(rec.rows, cfg.dtypes[0], sweep_dtype, cfg.sweep_tokens)
    _print_targets(targets)
    rec.sample_load("end")
    return _document(cfg, rec, sweep_dtype, matmul, targets)


def run_gpt2(rec: Recorder, cfg: Config, impls: Sequence[Impl]) -> dict[str, float | None]:
    """Every implementation and the matmul at the GPT-2-small shape, in each of `cfg.dtypes`.

    Returns the matmul's FLOP/s by dtype, the roof the sweep's rows are measured against.
    """
    matmul: dict[str, float | None] = {}
    for dtype in cfg.dtypes:
        _say(f"GPT-2-small shape {cfg.gpt2}, {cfg.device} {dtype}")
        matmul[dtype] = run_group(
            rec, cfg, "gpt2", impls, cfg.gpt2, dtype, with_matmul=True, matmul_flops_per_s=None
        )
        rec.sample_load(f"after gpt2 {dtype}")
    return matmul


def run_sweep(
    rec: Recorder,
    cfg: Config,
    impls: Sequence[Impl],
    sweep_dtype: str,
    matmul_flops_per_s: float | None,
) -> None:
    """Every implementation at each of `cfg.sweep_tokens`, at the GPT-2 width, in `sweep_dtype`."""
    _say(f"context-length sweep, batch {cfg.sweep_batch}, {cfg.device} {sweep_dtype}")
    roof = matmul_flops_per_s  # measured at the GPT-2 shape, in sweep_dtype
    for num_tokens in cfg.sweep_tokens:
        shape = Shape(cfg.sweep_batch, num_tokens, cfg.gpt2.d_model, cfg.gpt2.num_heads)
        run_group(
            rec, cfg, "sweep", impls, shape, sweep_dtype, with_matmul=False, matmul_flops_per_s=roof
        )
        rec.sample_load(f"after sweep T={num_tokens}")


def _print_targets(targets: list[dict[str, Any]]) -> None:
    """Each target's value against its limit, and whether it was met."""
    print("targets (production module):")
    for t in targets:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        sign = ">=" if t.get("at_least") else "<="
        print(f"  {t['target']}: {t['value']:.3f} (target {sign} {t['limit']}) {verdict}")


def _document(
    cfg: Config,
    rec: Recorder,
    sweep_dtype: str,
    matmul: dict[str, float | None],
    targets: list[dict[str, Any]],
) -> dict[str, Any]:
    """The results document of a finished run: when, where, how, and every row."""
    return {
        "schema": SCHEMA_VERSION,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(cfg.device),
        "config": _config(cfg, sweep_dtype),
        "method": METHOD,
        "load_average": rec.load,
        "runtime_s": round(time.perf_counter() - rec.start, 1),
        "matmul_flops_per_s": matmul,
        "targets": targets,
        "results": rec.rows,
    }


def _config(cfg: Config, sweep_dtype: str) -> dict[str, Any]:
    """What a results file records of the `Config` that produced it."""
    return {
        "dtypes": list(cfg.dtypes),
        "sweep_dtype": sweep_dtype,
        "gpt2": vars(cfg.gpt2),
        "sweep_batch": cfg.sweep_batch,
        "sweep_tokens": list(cfg.sweep_tokens),
        "max_explicit_tokens": cfg.max_explicit_tokens,
        "group_budget_s": cfg.group_budget_s,
        "repeats": {
            "min": cfg.min_repeats,
            "min_gpt2": cfg.gpt2_min_repeats,
            "max": cfg.max_repeats,
        },
        "reference": REFERENCE,
        "construct_context_length": cfg.construct_context_length,
        "decode_tokens": list(cfg.decode_tokens),
        "batched_new": cfg.batched_new,
        "experiments": list(cfg.experiments),
    }
