"""The results files: where they live, what a row holds, how they were measured (`METHOD`).

One JSON document per machine, `attention_bench/results/<machine>.json`, written by
`python -m attention_bench` (`nox -s bench`) and read by the Performance page.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["METHOD", "RESULTS_DIR", "SCHEMA_VERSION", "find", "load_results", "machine", "select"]

SCHEMA_VERSION = 1
RESULTS_DIR = Path(__file__).resolve().parent / "results"

METHOD = {
    "timing": (
        "one warm-up call per implementation, then rounds in which each runs once, the order "
        "rotated each round so that a shared machine's drift hits all alike; "
        "time.perf_counter per call (torch.cuda.synchronize around it on CUDA); median and "
        "quartiles"
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
    "flops": (
        "useful FLOPs: projections 2*b*T*d_in*width each (width d_out, or h_kv*d_h for the "
        "keys and values of grouped heads), QK^T and AV 2*b*T^2*d_out each, halved for causal, "
        "the band's T*w - w*(w-1)/2 - T/2 pairs instead for a window w; forward+backward = 3x "
        "forward; softmax ignored (attention_bench.flops)"
    ),
    "matmul_fraction": (
        "achieved FLOP/s (at the median time) divided by that of the fastest call of "
        "(b*T, d_model) @ (d_model, d_model), preallocated output, timed in the GPT-2 forward "
        "group"
    ),
    "construct": (
        "wall time of MultiHeadAttention(d_model, d_model, construct_context_length, 0.0, "
        "num_heads), min_repeats times, median"
    ),
    "first_call_s": (
        "torch.compile: the first call in each mode, compiling with an empty inductor cache"
    ),
    "generation": (
        "the book's GPT (dropout 0, eval, no_grad) and, where transformers is installed, "
        "Hugging Face's GPT2LMHeadModel holding the same weights (attention_bench.hf, sdpa "
        "attention): at each batch size a warm-up round, then rounds in which each runs its "
        "prefill (one forward over the prompt filling a fresh cache, allocation included), "
        "then new_tokens greedy decode steps, each timed alone, the two taking turns step by "
        "step, then each one's whole greedy generate (Hugging Face's with min_new_tokens = "
        "max_new_tokens); the order of the two alternates each round; medians over rounds "
        "(prefill, generation) and over every step (decode)"
    ),
    "padded_batch": (
        "the same model: prompts of the recorded lengths, left-padded into one batch with an "
        "attention_mask and generated together (new_tokens greedy tokens each), against the "
        "same prompts generated one after another, and against Hugging Face's generate of the "
        "same padded batch; a warm-up round, then rounds in which each runs once, the order "
        "alternating; s_per_token = median time / (prompts x new_tokens)"
    ),
}
"""How every number in a results file was measured: stored in each file, shown by the page."""


def machine(device: str) -> dict[str, Any]:
    """What ran the benchmark: CPU/GPU model, threads, versions, and a file-name slug."""
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


def load_results(directory: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every results file of the current schema in `directory`, sorted by machine.

    Raises:
        ValueError: a file that is not valid JSON, or not a JSON object, named.
    """
    docs = []
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(
                f"{path} is not a valid JSON file (truncated or corrupted): {error}"
            ) from error
        if not isinstance(doc, dict):
            raise ValueError(f"{path} must hold a JSON object, got a {type(doc).__name__}")
        docs.append(doc)
    return [d for d in docs if d.get("schema") == SCHEMA_VERSION]


def select(results: Mapping[str, Any], **match: Any) -> Iterator[dict[str, Any]]:
    """The measured (not skipped) rows of one results document whose fields equal `match`.

    Examples:
        >>> doc = {"results": [{"impl": "a", "mode": "forward"}, {"impl": "b", "skipped": "x"}]}
        >>> [row["impl"] for row in select(doc)]
        ['a']
    """
    for row in results["results"]:
        if "skipped" not in row and all(row.get(k) == v for k, v in match.items()):
            yield row


def find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    """The first measured row of `rows` that matches, or None."""
    return next(select({"results": rows}, **match), None)
