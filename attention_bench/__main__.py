"""`python -m attention_bench [--quick] [--device cpu|cuda] [--out PATH] [--no-compile] [--only E]`.

`--only decode --out /tmp/decode.json` runs the generation experiment alone (ours against
Hugging Face's GPT-2 where `transformers` is installed). A partial run needs `--out`: it never
replaces the committed results file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from attention_bench.experiments import EXPERIMENTS, Config, run
from attention_bench.results import RESULTS_DIR


def main(argv: Sequence[str] | None = None) -> Path:
    """Parse the command line, run, write the JSON; return its path."""
    parser = argparse.ArgumentParser(
        prog="python -m attention_bench",
        description="Time and memory of every attention implementation, into a JSON file.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to test the harness")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--out", type=Path, help=f"JSON path (default {RESULTS_DIR}/<machine>.json)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=EXPERIMENTS,
        metavar="EXPERIMENT",
        help=f"run only these experiments ({', '.join(EXPERIMENTS)}); needs --out",
    )
    args = parser.parse_args(argv)
    if args.only and args.out is None:
        parser.error("--only needs --out: a partial run does not replace the results file")
    cfg = Config.quick(args.device) if args.quick else Config.full(args.device)
    if args.no_compile:
        cfg.compile = False
    if args.only:
        cfg.experiments = tuple(name for name in EXPERIMENTS if name in args.only)
    results = run(cfg)
    out = args.out or RESULTS_DIR / f"{results['machine']['slug']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out} in {results['runtime_s']:.0f} s")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
