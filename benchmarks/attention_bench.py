r"""How fast and how lean is each attention implementation? Measured, with the reasons.

Run it as `nox -s bench` (installs, runs, writes `benchmarks/results/<machine>.json`), or
directly: `python benchmarks/attention_bench.py [--quick] [--device cpu|cuda] [--out PATH]`.

What is measured, each in *forward* (inference: `eval()`, `torch.no_grad()`) and
*forward+backward* (training: `train()`, dropout 0, gradients for the input and every
parameter, `out.backward(grad_out)`) mode:

| name | what |
| --- | --- |
| `wrapper` | `MultiHeadAttentionWrapper`: one `CausalAttention` per head, concatenated |
| `explicit` | production `MultiHeadAttention(..., need_weights=True)`: the explicit path |
| `production` | production `MultiHeadAttention` (fused `scaled_dot_product_attention`) |
| `production_padded` | the same with a `key_padding_mask`: right padding, last eighth of each row |
| `production_left_padded` | the same, left padding: first eighth of each row |
| `sdpa_reference` | `SDPAReference`: three `Linear`s, SDPA `is_causal=True`, `out_proj` |
| `torch_mha` | `torch.nn.MultiheadAttention(need_weights=False)`, causal |
| `torch_mha_weights` | `torch.nn.MultiheadAttention` with its default `need_weights=True` |
| `torch_mha_padded` | `torch.nn.MultiheadAttention(need_weights=False)` + `key_padding_mask` |
| `matmul` | `(batch * num_tokens, d_model) @ (d_model, d_model)`: the machine's matmul speed |

Every module has biases on the query/key/value and output projections (GPT-2's choice), so
all do the same arithmetic (the wrapper has no output projection).

Method:

- **Time**: per group of implementations, one warm-up call each, then `repeats` rounds in
  which every implementation runs once, the order rotated by one each round so that each
  takes every position and slow drift of a shared machine hits all alike. Each call is timed
  with `time.perf_counter` (bracketed by `torch.cuda.synchronize()` on CUDA); we report the
  median and the quartiles.
- **Peak memory**: CPU tensors have no allocator peak counter, so the warm-up call runs under
  `torch.profiler.profile(profile_memory=True)`, which records every allocation and free of a
  tensor storage (kernel workspaces included); the peak is the running maximum of allocated
  minus freed bytes, above what was allocated before the call (parameters, buffers and input
  are not counted: they are reported as `state_bytes`). On CUDA,
  `torch.cuda.max_memory_allocated()` minus the bytes allocated before the call.
- **FLOPs**: `attention_flops`: the useful multiply-adds, causal attention counted as half
  of the full $T \times T$ products; achieved FLOP/s is compared with the fastest call of
  `matmul`, timed in the same group (the machine's roof).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import MultiHeadAttention, MultiHeadAttentionWrapper

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REFERENCE = "sdpa_reference"
MODES = ("forward", "forward_backward")
SDPA_BACKENDS = ("flash", "efficient", "math")


# --------------------------------------------------------------------------------------------
# The reference module and the FLOP count
# --------------------------------------------------------------------------------------------


class SDPAReference(nn.Module):
    r"""The minimal causal multi-head attention on the fused kernel: what ours must match.

    $$
    \text{out} = \big[\operatorname{SDPA}(Q^{(i)}, K^{(i)}, V^{(i)},
    \text{is\_causal})\big]_{i=1}^{h} W_o + b_o
    $$

    with three separate projections (like the production module, so both do the same work).

    Args:
        d_in: width of each input embedding.
        d_out: total output width, `num_heads * head_dim`.
        num_heads: number of heads $h$.
        qkv_bias: whether the query/key/value projections have a bias.

    Examples:
        >>> ref = SDPAReference(8, 8, num_heads=2)
        >>> ref(torch.randn(3, 5, 8)).shape  # (batch, num_tokens, d_out)
        torch.Size([3, 5, 8])
    """

    def __init__(self, d_in: int, d_out: int, num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)

    def forward(self, x: Tensor) -> Tensor:
        b, T, _ = x.shape
        split = (b, T, self.num_heads, self.head_dim)
        queries = self.W_query(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        keys = self.W_key(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        values = self.W_value(x).view(split).transpose(1, 2)  # (b, h, T, d_h)
        context_vec = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)
        context_vec = context_vec.transpose(1, 2).reshape(b, T, -1)  # (b, T, d_out)
        out: Tensor = self.out_proj(context_vec)  # (b, T, d_out)
        return out


def attention_flops(
    batch: int,
    num_tokens: int,
    d_in: int,
    d_out: int,
    *,
    causal: bool = True,
    out_proj: bool = True,
    backward: bool = False,
) -> int:
    r"""Useful floating-point operations of one multi-head self-attention call.

    A matmul $(m \times k)(k \times n)$ costs $2mkn$ FLOPs. With $b$ sequences of $T$ tokens,
    $h$ heads of width $d_h$ ($h d_h = d_\text{out}$):

    $$
    \underbrace{3 \cdot 2 b T d_\text{in} d_\text{out}}_{W_q, W_k, W_v}
    + \underbrace{2 b T d_\text{out}^2}_{W_o}
    + \underbrace{c \cdot (2 b h T^2 d_h + 2 b h T^2 d_h)}_{Q K^\top \text{ and } \alpha V},
    \qquad c = \tfrac12 \text{ if causal else } 1,
    $$

    softmax, scaling and biases ignored. The backward pass costs twice the forward (two
    matmuls per matmul: the gradient of each operand), so forward+backward is 3x.

    Args:
        batch: $b$.
        num_tokens: $T$.
        d_in: input width.
        d_out: total head width $h d_h$ (the number of heads cancels out).
        causal: count only the lower triangle of the $T \times T$ products.
        out_proj: include the output projection (the wrapper has none).
        backward: count forward+backward.

    Returns:
        The FLOP count.

    Examples:
        >>> attention_flops(1, 4, 2, 2, causal=False)  # 3*2*4*2*2 + 2*4*2*2 + 4*4*4*2
        256
        >>> attention_flops(1, 4, 2, 2, causal=False, backward=True)
        768
    """
    projections, scores_and_mix = flop_terms(
        batch, num_tokens, d_in, d_out, causal=causal, out_proj=out_proj
    )
    forward = projections + scores_and_mix
    return 3 * forward if backward else forward


def flop_terms(
    batch: int,
    num_tokens: int,
    d_in: int,
    d_out: int,
    *,
    causal: bool = True,
    out_proj: bool = True,
) -> tuple[int, int]:
    r"""The two terms of `attention_flops`'s forward count: `(projections, attention)`.

    The projections grow like $T$, the attention ($Q K^\top$ and $\alpha V$) like $T^2$, so
    they are equal at one length, $T^* = T \cdot \text{projections} / \text{attention}$ for
    any $T$: with $d_\text{in} = d_\text{out} = d$, $8 b T d^2 = 2 b T^2 d$ gives $T^* = 4d$
    (causal; $2d$ without the mask).

    Examples:
        >>> projections, attention = flop_terms(1, 1024, 768, 768)
        >>> 1024 * projections // attention  # the crossover length T*: 4 * 768
        3072
    """
    projections = 3 * 2 * batch * num_tokens * d_in * d_out
    if out_proj:
        projections += 2 * batch * num_tokens * d_out * d_out
    scores_and_mix = 4 * batch * num_tokens * num_tokens * d_out
    if causal:
        scores_and_mix //= 2
    return projections, scores_and_mix


# --------------------------------------------------------------------------------------------
# The implementations, each built as one module whose forward(x) returns (batch, T, d_out)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: `batch` sequences of `num_tokens` tokens, `d_model` wide."""

    batch: int
    num_tokens: int
    d_model: int
    num_heads: int


class _Call(nn.Module):
    """Adapts a module with another call signature to `forward(x) -> (batch, T, d_out)`."""

    key_padding_mask: Tensor | None
    causal_mask: Tensor | None

    def __init__(
        self,
        inner: nn.Module,
        call: Callable[[_Call, Tensor], Tensor],
        *,
        key_padding_mask: Tensor | None = None,
        causal_mask: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self._call = call
        self.register_buffer("key_padding_mask", key_padding_mask)
        self.register_buffer("causal_mask", causal_mask)

    def forward(self, x: Tensor) -> Tensor:
        return self._call(self, x)


def _padding(shape: Shape, side: str = "right") -> Tensor:
    """An eighth of every sequence is padding (True): its end (right) or its start (left)."""
    key_padding_mask = torch.zeros(shape.batch, shape.num_tokens, dtype=torch.bool)
    n_pad = shape.num_tokens // 8
    if side == "right":
        key_padding_mask[:, shape.num_tokens - n_pad :] = True
    else:
        key_padding_mask[:, :n_pad] = True
    return key_padding_mask  # (b, T)


def _torch_mha(shape: Shape, *, need_weights: bool, padded: bool) -> nn.Module:
    mha = nn.MultiheadAttention(shape.d_model, shape.num_heads, bias=True, batch_first=True)
    # nn.MultiheadAttention needs the (T, T) mask even with is_causal=True (it is a hint).
    causal_mask = torch.ones(shape.num_tokens, shape.num_tokens, dtype=torch.bool).triu(1)

    def call(m: _Call, x: Tensor) -> Tensor:
        out, _ = m.inner(
            x,
            x,
            x,
            key_padding_mask=m.key_padding_mask,
            need_weights=need_weights,
            attn_mask=m.causal_mask,
            is_causal=True,
        )
        return out  # type: ignore[no-any-return]

    padding = _padding(shape) if padded else None
    return _Call(mha, call, key_padding_mask=padding, causal_mask=causal_mask)


def _production(
    shape: Shape, *, need_weights: bool = False, padded: str | None = None
) -> nn.Module:
    mha = MultiHeadAttention(
        shape.d_model, shape.d_model, shape.num_tokens, 0.0, shape.num_heads, qkv_bias=True
    )
    if not need_weights and not padded:
        return mha

    def call(m: _Call, x: Tensor) -> Tensor:
        out = m.inner(x, m.key_padding_mask, need_weights=need_weights)
        return out[0] if need_weights else out  # type: ignore[no-any-return]

    return _Call(mha, call, key_padding_mask=_padding(shape, padded) if padded else None)


@dataclass(frozen=True)
class Impl:
    """One implementation: how to build it, and up to which length it is worth running."""

    name: str
    build: Callable[[Shape], nn.Module]
    out_proj: bool = True
    modes: tuple[str, ...] = MODES
    max_tokens: int | None = None
    capped_modes: tuple[str, ...] = MODES  # the modes that `max_tokens` limits
    skip_reason: str = ""
    backend: str | None = None  # CUDA only: force one SDPA backend

    def skipped(self, mode: str, shape: Shape) -> str | None:
        """Why `mode` is not run at `shape`, or None if it is."""
        if self.max_tokens is None or mode not in self.capped_modes:
            return None
        if shape.num_tokens <= self.max_tokens:
            return None
        gib = 4 * shape.batch * shape.num_heads * shape.num_tokens**2 / 2**30
        return self.skip_reason.format(gib=gib, T=shape.num_tokens)


_TT = (
    "materialises (batch, num_heads, T, T) fp32 weights, {gib:.1f} GiB per copy at T={T}, "
    "several copies alive at once: over this run's memory and time budget"
)
_FASTPATH = (
    "nn.MultiheadAttention's inference fast path (eval + no_grad; the causal attn_mask it "
    "requires, or the key_padding_mask, is merged into a mask) " + _TT
)


def implementations(max_explicit_tokens: int) -> list[Impl]:
    """Every implementation compared, the SDPA reference first."""
    n = max_explicit_tokens
    forward = ("forward",)
    return [
        Impl(REFERENCE, lambda s: SDPAReference(s.d_model, s.d_model, s.num_heads)),
        Impl("production", _production),
        Impl(
            "explicit",
            lambda s: _production(s, need_weights=True),
            max_tokens=n,
            skip_reason=_TT,
        ),
        Impl(
            "wrapper",
            lambda s: MultiHeadAttentionWrapper(
                s.d_model, s.d_model // s.num_heads, s.num_tokens, 0.0, s.num_heads, True
            ),
            out_proj=False,
            max_tokens=n,
            skip_reason=_TT,
        ),
        Impl(
            "torch_mha",
            lambda s: _torch_mha(s, need_weights=False, padded=False),
            max_tokens=n,
            capped_modes=forward,
            skip_reason=_FASTPATH,
        ),
        Impl(
            "torch_mha_weights",
            lambda s: _torch_mha(s, need_weights=True, padded=False),
            max_tokens=n,
            skip_reason=_TT,
        ),
        Impl("production_padded", lambda s: _production(s, padded="right"), modes=forward),
        Impl("production_left_padded", lambda s: _production(s, padded="left"), modes=forward),
        Impl(
            "torch_mha_padded",
            lambda s: _torch_mha(s, need_weights=False, padded=True),
            modes=forward,
            max_tokens=n,
            skip_reason=_FASTPATH,
        ),
    ]


def cuda_backend_impls() -> list[Impl]:
    """CUDA only: the reference and production modules with one SDPA backend forced."""
    return [
        Impl(f"{impl.name}[{backend}]", impl.build, backend=backend)
        for impl in implementations(0)[:2]
        for backend in SDPA_BACKENDS
    ]


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


@dataclass
class Device:
    """Where the run happens, and how to wait for it to finish."""

    type: str

    def sync(self) -> None:
        if self.type == "cuda":
            torch.cuda.synchronize()

    def peak_bytes(self, fn: Callable[[], object]) -> tuple[int, object]:
        """Run `fn` once; the peak of tensor bytes it allocated above those already alive."""
        if self.type == "cuda":
            self.sync()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            result = fn()
            self.sync()
            return torch.cuda.max_memory_allocated() - before, result
        return _cpu_peak_bytes(fn)


def _cpu_peak_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    """Peak CPU tensor bytes allocated by `fn`, from the profiler's allocation records."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
    allocated = peak = 0
    for _, nbytes in sorted(events):  # frees are negative sizes
        allocated += nbytes
        peak = max(peak, allocated)
    return peak, result


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the profiler's C++ start/stop lines (file descriptor 2) during a measurement."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def state_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (masks included)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def make_step(
    module: nn.Module, x: Tensor, mode: str, grad_out: Tensor, backend: str | None
) -> Callable[[], object]:
    """One call of `module` in `mode`: inference forward, or a training forward+backward."""
    kernel = _sdpa_kernel(backend)
    if mode == "forward":
        module.eval()
        x_in = x.detach()

        def forward() -> object:
            with torch.no_grad(), kernel():
                return module(x_in)

        return forward
    module.train()
    x_in = x.detach().requires_grad_(True)
    params = list(module.parameters())

    def forward_backward() -> object:
        for p in params:
            p.grad = None
        x_in.grad = None
        with kernel():
            module(x_in).backward(grad_out)
        return None

    return forward_backward


def _sdpa_kernel(backend: str | None) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    if backend is None:
        return contextlib.nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]
    return lambda: sdpa_kernel(chosen)


@dataclass
class Timing:
    """The measured times of one callable."""

    times_s: list[float] = field(default_factory=list)
    peak_bytes: int | None = None

    def summary(self) -> dict[str, Any]:
        q1, _, q3 = statistics.quantiles(self.times_s, n=4, method="inclusive")
        return {
            "median_s": statistics.median(self.times_s),
            "q1_s": q1,
            "q3_s": q3,
            "runs": len(self.times_s),
            "times_s": [round(t, 6) for t in self.times_s],
        }


def measure(
    steps: dict[str, Callable[[], object]],
    device: Device,
    *,
    budget_s: float,
    min_repeats: int,
    max_repeats: int,
    memory: bool = True,
) -> dict[str, Timing]:
    """Warm up each step once (measuring its peak memory), then time them in rotating order.

    The number of rounds is what fits `budget_s` at the warm-up speed, within
    `[min_repeats, max_repeats]`.
    """
    timings = {name: Timing() for name in steps}
    warm_s = 0.0
    for name, step in steps.items():
        start = time.perf_counter()
        if memory:
            timings[name].peak_bytes, _ = device.peak_bytes(step)
        else:
            step()
        device.sync()
        warm_s += time.perf_counter() - start
    repeats = int(min(max_repeats, max(min_repeats, budget_s // max(warm_s, 1e-9))))
    names = list(steps)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            device.sync()
            start = time.perf_counter()
            steps[name]()
            device.sync()
            timings[name].times_s.append(time.perf_counter() - start)
    return timings


# --------------------------------------------------------------------------------------------
# The experiments
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    """The sizes and budgets of one run."""

    device: str = "cpu"
    dtypes: tuple[str, ...] = ("float32",)
    gpt2: Shape = Shape(batch=8, num_tokens=1024, d_model=768, num_heads=12)
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

    @classmethod
    def quick(cls, device: str) -> Config:
        """Tiny sizes: checks the harness end to end in seconds (numbers are meaningless)."""
        return cls(
            device=device,
            dtypes=_dtypes(device)[:1],
            gpt2=Shape(batch=2, num_tokens=64, d_model=64, num_heads=4),
            sweep_tokens=(32, 64, 128),
            max_explicit_tokens=64,
            group_budget_s=0.2,
            min_repeats=3,
            gpt2_min_repeats=3,
            max_repeats=3,
            compile=False,
        )


def _dtypes(device: str) -> tuple[str, ...]:
    return ("float32", "float16", "bfloat16") if device == "cuda" else ("float32",)


class Recorder:
    """Collects result rows and load-average samples, and prints progress."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.load: list[dict[str, Any]] = []
        self.start = time.perf_counter()
        self.sample_load("start")

    def sample_load(self, when: str) -> None:
        one, five, fifteen = os.getloadavg()
        elapsed = round(time.perf_counter() - self.start, 1)
        self.load.append({"when": when, "elapsed_s": elapsed, "loadavg": [one, five, fifteen]})

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if "skipped" in row:
            print(f"  {row['impl']:<22} {row['mode']:<16} T={row['num_tokens']:<5} skipped")
            return
        peak = row.get("peak_bytes")
        mem = "" if peak is None else f"  peak {peak / 2**20:8.1f} MiB"
        ratio = row.get("ratio_to_reference")
        ratio_s = "" if ratio is None else f"  {ratio:5.2f}x ref"
        frac = row.get("matmul_fraction")
        frac_s = "" if frac is None else f"  {100 * frac:5.1f}% of matmul"
        print(
            f"  {row['impl']:<22} {row['mode']:<16} T={row['num_tokens']:<5} "
            f"{1e3 * row['median_s']:9.2f} ms{ratio_s}{frac_s}{mem}",
            flush=True,
        )


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
    base = {
        "experiment": experiment,
        "device": cfg.device,
        "dtype": dtype,
        "batch": shape.batch,
        "num_tokens": shape.num_tokens,
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
    }
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
    matmul_result = None
    for mode in MODES:
        steps: dict[str, Callable[[], object]] = {}
        for impl in runs[mode]:
            module = modules[impl.name][1]
            steps[impl.name] = make_step(module, x, mode, grad_out, impl.backend)
        if with_matmul and mode == "forward":
            a = x.reshape(-1, shape.d_model)  # (b * T, d_model)
            w = torch.randn(shape.d_model, shape.d_model, device=cfg.device, dtype=torch_dtype)
            c = torch.empty_like(a)  # (b * T, d_model): no allocation inside the timing
            steps["matmul"] = functools.partial(torch.matmul, a, w, out=c)
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
            matmul_result = 2 * shape.batch * shape.num_tokens * shape.d_model**2 / matmul_s
            matmul_flops_per_s = matmul_result
        ref = timings.get(REFERENCE)
        ref_s = None if ref is None else ref.summary()["median_s"]
        for name, timing in timings.items():
            row = {**base, "impl": name, "mode": mode, **timing.summary()}
            if name == "matmul":
                row["flops"] = 2 * shape.batch * shape.num_tokens * shape.d_model**2
            else:
                impl = modules[name][0]
                row["flops"] = attention_flops(
                    shape.batch,
                    shape.num_tokens,
                    shape.d_model,
                    shape.d_model,
                    out_proj=impl.out_proj,
                    backward=mode == "forward_backward",
                )
                row["state_bytes"] = state_bytes(modules[name][1])
                row["peak_bytes"] = timing.peak_bytes
            row["flops_per_s"] = row["flops"] / row["median_s"]
            if matmul_flops_per_s:
                row["matmul_fraction"] = row["flops_per_s"] / matmul_flops_per_s
            if ref_s is not None and name != "matmul":
                row["ratio_to_reference"] = row["median_s"] / ref_s
            rec.add(row)
    return matmul_result


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


def run_compile(rec: Recorder, cfg: Config, dtype: str) -> None:
    """Production module eager vs `torch.compile`d, both modes, at the GPT-2 shape.

    The compiler's on-disk cache starts empty, so `first_call_s` is what a first compile
    costs (a later process with the same code and shapes would hit the cache).
    """
    with tempfile.TemporaryDirectory(prefix="attention-bench-inductor-") as cache:
        saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
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
    eager = _production(shape).to(cfg.device, torch_dtype)
    compiled = torch.compile(eager)
    base = {
        "experiment": "compile",
        "device": cfg.device,
        "dtype": dtype,
        "batch": shape.batch,
        "num_tokens": shape.num_tokens,
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
    }
    for mode in MODES:
        steps = {
            "production": make_step(eager, x, mode, grad_out, None),
            "production_compiled": make_step(compiled, x, mode, grad_out, None),  # type: ignore[arg-type]
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


# --------------------------------------------------------------------------------------------
# Targets, machine stamp, main
# --------------------------------------------------------------------------------------------


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next(select({"results": rows}, **match), None)


def check_targets(
    rows: list[dict[str, Any]], cfg: Config, dtype: str, sweep_dtype: str
) -> list[dict[str, Any]]:
    """The production module's targets: not timed tests, printed and recorded.

    Time at the GPT-2 shape in `dtype`; memory at the sweep's longest context in `sweep_dtype`.
    """
    targets = []

    def target(name: str, value: float | None, limit: float, what: str) -> None:
        met = None if value is None else value <= limit
        targets.append({"target": name, "value": value, "limit": limit, "met": met, "what": what})

    gpt2 = {"experiment": "gpt2", "dtype": dtype, "mode": "forward_backward"}
    prod = _find(rows, impl="production", **gpt2)
    ref = _find(rows, impl=REFERENCE, **gpt2)
    mha = _find(rows, impl="torch_mha_weights", **gpt2)
    if prod and ref:
        target(
            "fwd+bwd time vs SDPA reference (GPT-2 shape)",
            prod["median_s"] / ref["median_s"],
            1.05,
            "production / sdpa_reference",
        )
    if prod and mha:
        target(
            "fwd+bwd time vs torch.nn.MultiheadAttention (GPT-2 shape)",
            prod["median_s"] / mha["median_s"],
            0.85,
            "production / torch_mha_weights (nn.MultiheadAttention's default need_weights=True)",
        )
    longest = max(cfg.sweep_tokens)
    sweep = {"experiment": "sweep", "dtype": sweep_dtype, "mode": "forward", "num_tokens": longest}
    ref_mem = _find(rows, impl=REFERENCE, **sweep)
    prod_mem = _find(rows, impl="production", **sweep)
    right_mem = _find(rows, impl="production_padded", **sweep)
    for name, row, base, limit, what in (
        ("production vs SDPA reference", prod_mem, ref_mem, 1.10, "production / sdpa_reference"),
        ("right-padded vs unpadded", right_mem, prod_mem, 1.25, "production_padded / production"),
    ):
        if row and base and row.get("peak_bytes") and base.get("peak_bytes"):
            target(
                f"peak forward memory at {longest} tokens, {name}",
                row["peak_bytes"] / base["peak_bytes"],
                limit,
                f"{what}, bytes allocated during the forward",
            )
    construct = _find(rows, experiment="construct")
    if construct:
        target(
            f"construction time at context_length={construct['context_length']} (s)",
            construct["median_s"],
            0.1,
            "MultiHeadAttention(768, 768, context_length, 0.0, 12), wall time",
        )
    return targets


def machine(device: str) -> dict[str, Any]:
    """What ran the benchmark: CPU/GPU model, threads, versions."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
    }
    model = info["gpu"] if device == "cuda" else f"{cpu} {info['torch_threads']}t"
    info["slug"] = re.sub(r"[^a-z0-9]+", "-", f"{device} {model}".lower()).strip("-")
    info["label"] = (
        f"{info['gpu']}, torch {torch.__version__}"
        if device == "cuda"
        else f"{cpu}, {info['torch_threads']} threads, torch {torch.__version__}"
    )
    return info


METHOD = {
    "timing": (
        "one warm-up call per implementation, then rounds in which each runs once, the order "
        "rotated each round; time.perf_counter per call (torch.cuda.synchronize around it on "
        "CUDA); median and quartiles"
    ),
    "forward": "inference: module.eval(), torch.no_grad()",
    "forward_backward": (
        "training: module.train(), dropout 0, input requires grad, out.backward(grad_out)"
    ),
    "peak_bytes": (
        "CPU: running maximum of allocated minus freed tensor bytes recorded by "
        "torch.profiler.profile(profile_memory=True) during the warm-up call; CUDA: "
        "torch.cuda.max_memory_allocated() - memory_allocated() before the call. Bytes "
        "alive before the call (parameters, buffers, input) are excluded: see state_bytes"
    ),
    "state_bytes": "parameters + buffers of the module (the wrapper's causal-mask buffers too)",
    "construct": (
        "wall time of MultiHeadAttention(d_model, d_model, construct_context_length, 0.0, "
        "num_heads), min_repeats times, median"
    ),
    "flops": (
        "useful FLOPs: projections 2*b*T*d_in*d_out each, QK^T and AV 2*b*T^2*d_out each, "
        "halved for causal; forward+backward = 3x forward; softmax ignored"
    ),
    "first_call_s": (
        "torch.compile: the first call in each mode, compiling with an empty inductor cache"
    ),
    "matmul_fraction": (
        "achieved FLOP/s (at the median time) divided by that of the fastest call of "
        "(b*T, d_model) @ (d_model, d_model), preallocated output, timed in the GPT-2 forward "
        "group"
    ),
}


def run_construct(rec: Recorder, cfg: Config) -> None:
    """How long building a long-context module takes, and what it holds: no T x T buffer."""
    shape = cfg.gpt2
    context_length = cfg.construct_context_length

    def build() -> nn.Module:
        return MultiHeadAttention(
            shape.d_model, shape.d_model, context_length, 0.0, shape.num_heads
        )

    times = []
    for _ in range(cfg.min_repeats):
        start = time.perf_counter()
        module = build()
        times.append(time.perf_counter() - start)
    row = {
        "experiment": "construct",
        "impl": "production",
        "mode": "construct",
        "device": "cpu",
        "dtype": "float32",
        "d_model": shape.d_model,
        "num_heads": shape.num_heads,
        "num_tokens": 0,
        "context_length": context_length,
        "state_bytes": state_bytes(module),
        **Timing(times).summary(),
    }
    rec.add(row)


def run(cfg: Config) -> dict[str, Any]:
    """Run every experiment of `cfg`; return the results document."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available in this torch build/machine")
    rec = Recorder()
    impls = implementations(cfg.max_explicit_tokens)
    if cfg.device == "cuda":
        impls = impls + cuda_backend_impls()
    matmul: dict[str, float | None] = {}
    for dtype in cfg.dtypes:
        print(f"GPT-2-small shape {cfg.gpt2}, {cfg.device} {dtype}", flush=True)
        matmul[dtype] = run_group(
            rec, cfg, "gpt2", impls, cfg.gpt2, dtype, with_matmul=True, matmul_flops_per_s=None
        )
        rec.sample_load(f"after gpt2 {dtype}")
    sweep_dtype = cfg.dtypes[0] if cfg.device == "cpu" else "float16"
    print(f"context-length sweep, batch {cfg.sweep_batch}, {cfg.device} {sweep_dtype}", flush=True)
    for num_tokens in cfg.sweep_tokens:
        shape = Shape(cfg.sweep_batch, num_tokens, cfg.gpt2.d_model, cfg.gpt2.num_heads)
        run_group(
            rec,
            cfg,
            "sweep",
            impls,
            shape,
            sweep_dtype,
            with_matmul=False,
            matmul_flops_per_s=matmul.get(sweep_dtype),
        )
        rec.sample_load(f"after sweep T={num_tokens}")
    print(f"construction at context_length={cfg.construct_context_length}", flush=True)
    run_construct(rec, cfg)
    if cfg.compile:
        print("torch.compile, production module", flush=True)
        run_compile(rec, cfg, cfg.dtypes[0])
        rec.sample_load("after compile")
    targets = check_targets(rec.rows, cfg, cfg.dtypes[0], sweep_dtype)
    print("targets (production module):")
    for t in targets:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        print(f"  {t['target']}: {t['value']:.3f} (limit {t['limit']}) {verdict}")
    rec.sample_load("end")
    return {
        "schema": SCHEMA_VERSION,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(cfg.device),
        "config": {
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
        },
        "method": METHOD,
        "load_average": rec.load,
        "runtime_s": round(time.perf_counter() - rec.start, 1),
        "matmul_flops_per_s": matmul,
        "targets": targets,
        "results": rec.rows,
    }


def main(argv: Sequence[str] | None = None) -> Path:
    """Parse the command line, run, write the JSON; return its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to test the harness")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, help="JSON path (default results/<machine>.json)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    cfg = Config.quick(args.device) if args.quick else Config(args.device, _dtypes(args.device))
    if args.no_compile:
        cfg.compile = False
    results = run(cfg)
    out = args.out or RESULTS_DIR / f"{results['machine']['slug']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out} in {results['runtime_s']:.0f} s")
    return out


def load_results(directory: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every committed results file, sorted by machine."""
    docs = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    return [d for d in docs if d.get("schema") == SCHEMA_VERSION]


def select(results: dict[str, Any], **match: Any) -> Iterator[dict[str, Any]]:
    """The measured (not skipped) rows of one results document that match `match`."""
    for row in results["results"]:
        if "skipped" not in row and all(row.get(k) == v for k, v in match.items()):
            yield row


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
