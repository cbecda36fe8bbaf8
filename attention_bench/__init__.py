"""How fast and how lean is each attention implementation? Measured, with the reasons.

Run it as `nox -s bench`, or `python -m attention_bench [--quick] [--device cpu|cuda]`: it
writes `attention_bench/results/<machine>.json`, which the Performance page draws. One module
per job:

- [`flops`][attention_bench.flops]: what a call must compute;
- [`implementations`][attention_bench.implementations]: what is compared;
- [`measuring`][attention_bench.measuring]: time, peak memory, the machine's roof;
- [`experiments`][attention_bench.experiments]: the experiments and the targets;
- [`decode`][attention_bench.decode]: generation, and its memory-bandwidth limit;
- [`generation`][attention_bench.generation]: generation's contenders, timed in turns;
- [`hf`][attention_bench.hf]: Hugging Face's GPT-2 on the book's weights, the contender;
- [`targets`][attention_bench.targets]: the targets, judged from one run's rows;
- [`results`][attention_bench.results]: the files, and how every number in them was measured;
- [`live`][attention_bench.live]: the page's live comparison, and how busy the machine was;
- [`batched`][attention_bench.batched]: a padded batch against its prompts one by one;
- [`calls`][attention_bench.calls]: the Python calls of one decode step, counted;
- [`window`][attention_bench.window]: a long sequence's window against causal attention;
- [`split_kv`][attention_bench.split_kv]: split-KV decoding's chunks against one pass, on
  torch's threads and on Python's (a script of its own, `python -m attention_bench.split_kv`).
"""

from __future__ import annotations

from attention_bench.experiments import Config, compare, run
from attention_bench.flops import attention_flops, flop_terms
from attention_bench.implementations import (
    REFERENCE,
    WINDOW,
    Impl,
    SDPAReference,
    Shape,
    implementations,
)
from attention_bench.measuring import Device, Roof, Timing, make_step, measure, roof, state_bytes
from attention_bench.results import METHOD, RESULTS_DIR, load_results, select

__all__ = [
    "METHOD",
    "REFERENCE",
    "RESULTS_DIR",
    "WINDOW",
    "Config",
    "Device",
    "Impl",
    "Roof",
    "SDPAReference",
    "Shape",
    "Timing",
    "attention_flops",
    "compare",
    "flop_terms",
    "implementations",
    "load_results",
    "make_step",
    "measure",
    "roof",
    "run",
    "select",
    "state_bytes",
]
