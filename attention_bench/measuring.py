"""Measuring: one step of a module, its time over rotating rounds, and its peak memory.

The method, as every results file records it, is [`METHOD`][attention_bench.results.METHOD].
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "ROOF_BYTES",
    "Device",
    "Roof",
    "Timing",
    "cpu_peak_bytes",
    "make_step",
    "measure",
    "milliseconds",
    "roof",
    "state_bytes",
]


@dataclass
class Device:
    """Where the run happens, and how to wait for it to finish."""

    type: str

    @classmethod
    def from_env(cls) -> Device:
        """The device named by `ATTENTION_DEVICE` (default `cpu`), as the nox sessions set it.

        Examples:
            >>> Device.from_env().type in ("cpu", "cuda")
            True
        """
        name = os.environ.get("ATTENTION_DEVICE", "cpu")
        return cls(torch.device(name).type)

    def sync(self) -> None:
        """Wait for queued GPU work; a no-op on the CPU."""
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
        return cpu_peak_bytes(fn)


def cpu_peak_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    """Peak CPU tensor bytes allocated by `fn`: the running maximum of allocations minus frees.

    CPU tensors have no allocator peak counter, so `fn` runs under
    `torch.profiler.profile(profile_memory=True)`, which records every allocation and free.

    Examples:
        >>> def allocate():
        ...     a = torch.empty(2**18)  # 1 MiB
        ...     b = torch.empty(2**19)  # 2 MiB more: 3 MiB alive, the peak
        ...     return b
        >>> cpu_peak_bytes(allocate)[0] == 3 * 2**20
        True
    """
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    try:
        events = _allocations(prof)
    except (ImportError, AttributeError):  # the private record is gone: the public one
        events = _allocations_by_operator(prof)
    allocated = peak = 0
    for _, nbytes in sorted(events):  # frees are negative sizes
        allocated += nbytes
        peak = max(peak, allocated)
    return peak, result


def _allocations(prof: Any) -> list[tuple[int, int]]:
    """(time, bytes) of every allocation and free: the profiler's event tree, a private API.

    Exact: it sees temporaries that an operator allocates and frees inside itself.
    """
    from torch._C._profiler import _EventType

    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
    return events


def _allocations_by_operator(prof: Any) -> list[tuple[int, int]]:
    """The public fallback: each operator's net bytes at its start, frees outside operators.

    A lower bound: a temporary allocated and freed inside one operator is not seen.
    """
    return [
        (int(1000 * event.time_range.start), event.self_cpu_memory_usage)
        for event in prof.events()
        if event.self_cpu_memory_usage
    ]


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
    """One call of `module` in `mode`: inference `forward`, or a training `forward_backward`."""
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
    """The measured times of one callable, and its peak memory if measured."""

    times_s: list[float] = field(default_factory=list)
    peak_bytes: int | None = None

    def summary(self) -> dict[str, Any]:
        """Median, quartiles and every time, as a results file stores them."""
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
    `[min_repeats, max_repeats]`; each round runs every step once, starting one further along
    than the round before, so that a shared machine's drift hits every step alike.
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


ROOF_BYTES = 2**30
"""The buffer the copy and read bandwidths are measured over: 1 GiB, more than any cache."""


@dataclass(frozen=True)
class Roof:
    """What the machine can do: arithmetic and memory bandwidth, and the ridge point between."""

    flops_per_s: float
    """$P$: the fastest matmul's FLOP/s."""
    bytes_per_s: float
    """$W$: the fastest large copy's bytes/s, read plus write."""
    read_bytes_per_s: float
    """$R$: the fastest large sum's bytes/s, reading only: what bounds a step that reads its
    operands once and writes next to nothing (a decode step)."""

    @property
    def ridge(self) -> float:
        """$P / W$ in FLOP/byte: below it a step waits for memory, above it for arithmetic."""
        return self.flops_per_s / self.bytes_per_s


def roof(device: Device | None = None, *, budget_s: float = 0.5, nbytes: int = ROOF_BYTES) -> Roof:
    """Measure $P$ with a `(4096, 768) @ (768, 768)` matmul, $W$ with a copy of `nbytes` (1 GiB)
    and $R$ with a sum over them.

    1 GiB is more than any cache: some server CPUs have 480 MiB of L3, in which a 64 MiB copy
    runs at twice the memory's rate. Each is timed five times with
    [`measure`][attention_bench.measuring.measure]; the fastest run is what the machine can do.
    """
    device = device or Device.from_env()
    a = torch.randn(4096, 768, device=device.type)
    w = torch.randn(768, 768, device=device.type)
    big = torch.ones(nbytes // 4, device=device.type)  # float32
    dst = torch.empty_like(big)
    timings = measure(
        {"matmul": lambda: a @ w, "copy": lambda: dst.copy_(big), "read": lambda: big.sum()},
        device,
        budget_s=budget_s,
        min_repeats=5,
        max_repeats=5,
        memory=False,
    )
    flops = 2 * a.shape[0] * a.shape[1] * w.shape[1]
    return Roof(
        flops_per_s=flops / min(timings["matmul"].times_s),
        bytes_per_s=2 * nbytes / min(timings["copy"].times_s),  # read + write
        read_bytes_per_s=nbytes / min(timings["read"].times_s),
    )


def milliseconds(seconds: float) -> str:
    """A time for a table: whole milliseconds from 10 ms, two decimals below.

    Examples:
        >>> milliseconds(0.01234), milliseconds(0.001234)
        ('12 ms', '1.23 ms')
    """
    ms = 1e3 * seconds
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2f} ms"
