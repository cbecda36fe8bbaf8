"""The explorer's forward (docs/javascripts/model.js) against PyTorch, on models the page does
not ship: grouped key/value heads, biases, learned positions, odd widths; and the explorer's
table of head scores against attention.lab.heads'.

The site's build checks the page's own model in Chromium; these run the same file under Node.js
where it is installed (skipped elsewhere), in float64, where only the order of the additions
can differ from PyTorch's.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from attention.lab.heads import induction_score, previous_token_score
from attention.model.gpt import GPTModel
from attention_site.explorer import EXACT, check_cases, export_model, reference

MODEL_JS = Path(__file__).parents[2] / "docs" / "javascripts" / "model.js"
NODE = shutil.which("node")

# Reads the model and the cases from stdin, prints each case's largest difference.
RUN_JS = """
global.window = {};
require(process.argv[1]);
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const bytes = Buffer.from(input.weights, "base64");
const model = window.attentionModel.load(input.meta,
  bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
const errors = input.cases.map((c) => {
  const out = window.attentionModel.forward(model, c.ids, c.settings);
  let worst = 0;
  c.ids.forEach((_, t) => out.logitsAt(t).forEach((v, i) => {
    worst = Math.max(worst, Math.abs(v - c.logits[t * input.meta.vocab_size + i]));
  }));
  out.weights.flatMap((w) => Array.from(w)).forEach((v, i) => {
    worst = Math.max(worst, Math.abs(v - c.weights[i]));
  });
  // the table's two scores of every head, as attention.lab.heads computes them (null: NaN)
  const T = c.ids.length, H = input.meta.n_heads;
  out.weights.forEach((w, l) => {
    for (let h = 0; h < H; h++) {
      const s = window.attentionModel.headScores(w.subarray(h * T * T, (h + 1) * T * T), c.ids);
      const want = c.scores[l * H + h];
      [[s.previous, want[0]], [s.induction, want[1]]].forEach(([got, expected]) => {
        const off = expected === null ? (Number.isNaN(got) ? 0 : Infinity) : Math.abs(got - expected);
        worst = Math.max(worst, Number.isNaN(off) ? Infinity : off);
      });
    }
  });
  return worst;
});
console.log(JSON.stringify(errors));
"""

BASE = {"vocab_size": 23, "context_length": 12, "drop_rate": 0.0, "n_layers": 2}


def node_errors(model: GPTModel, cfg: dict[str, Any], cases: list[Any]) -> list[float]:
    """Run model.js under Node on `cases`; PyTorch's answers from a float64 copy."""
    meta, blob = export_model(model, [f"t{i}" for i in range(model.vocab_size)])
    exact = GPTModel(cfg).double().eval()
    exact.load_state_dict(model.state_dict())
    payload = {"meta": meta, "weights": base64.b64encode(blob).decode(), "cases": []}
    for idx, settings in cases:
        logits, weights = reference(exact, idx, settings)
        one = weights[:, None]  # (L, 1, H, T, T): a batch of one sequence
        scores = torch.stack([previous_token_score(one), induction_score(one, idx)], dim=-1)
        payload["cases"].append({"ids": idx[0].tolist(), "settings": asdict(settings),
                                 "logits": logits.flatten().tolist(),
                                 "weights": weights.flatten().tolist(),
                                 "scores": [[None if math.isnan(v) else v for v in pair]
                                            for pair in scores.flatten(0, 1).tolist()]})  # fmt: skip
    done = subprocess.run([NODE, "-e", RUN_JS, str(MODEL_JS)], input=json.dumps(payload),
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed")
@pytest.mark.parametrize(
    "extra",
    [
        {"emb_dim": 16, "n_heads": 4, "n_kv_heads": 2, "qkv_bias": True, "rope_base": 10_000.0},
        {"emb_dim": 16, "n_heads": 4, "n_kv_heads": 1, "qkv_bias": False, "rope_base": 50.0},
        {"emb_dim": 15, "n_heads": 3, "qkv_bias": True},  # learned positions, odd widths
    ],
)
def test_the_browsers_forward_is_pytorchs(extra: dict[str, Any]) -> None:
    torch.manual_seed(0)
    cfg = {**BASE, **extra}
    model = GPTModel(cfg).eval()
    presets = {"a": torch.randint(23, (1, 9), generator=torch.Generator().manual_seed(1))}
    errors = node_errors(model, cfg, check_cases(model, presets, num_random=16, seed=2))
    assert max(errors) <= EXACT, errors
