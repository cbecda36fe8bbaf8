/* The forward pass of attention.model.gpt.GPTModel, written for the browser: window.attentionModel.
 *
 * attention_site.explorer.export_model sends a model as JSON (its configuration, its vocabulary, and
 * where each state-dict tensor lies) and one float32 file of weights. This file runs that model:
 *
 *   x = tok_emb[ids] (+ pos_emb[t])                                   (T, d)
 *   per block:  x = x + out_proj(attention(norm1(x)))                 the residual stream
 *               x = x + ff(norm2(x)),  ff = Linear(d, 4d), GELU, Linear(4d, d)
 *   logits = out_head(final_norm(x))                                  (T, V)
 *
 * attention, per query head h (key/value head g = floor(h / (H / H_kv)), grouped-query):
 *   q, k rotated by RoPE (pairs (i, i + d_h/2) turned by t * base^(-2i/d_h)) when the model has it,
 *   S = q k^T / (tau sqrt(d_h)), hidden keys at -inf, alpha = softmax(S), context = alpha v;
 * a query t sees key s when s <= t, and, with a window w, t - s < w unless s < sinks, and, with
 * documents, s is in t's document (attention.visibility's rule, the same three factors).
 *
 * Numbers are JavaScript's float64 throughout; the weights are the model's float32. The site's
 * build runs this file in headless Chromium against attention_site.explorer.reference (PyTorch) and
 * fails unless they agree within attention_site.explorer.TOLERANCE. Plain JavaScript, no dependency;
 * it fetches nothing itself (the explorer fetches the weights file beside the page).
 */
(() => {
  "use strict";

  /* The model: meta (export_model's JSON) and its weights (an ArrayBuffer of float32s). */
  function load(meta, buffer) {
    const floats = new Float32Array(buffer);
    if (floats.length !== meta.floats) {
      throw new Error(`weights file: ${floats.length} floats, expected ${meta.floats}`);
    }
    const all = Float64Array.from(floats); // the same values: float64 loops run faster
    const t = (name) => {
      const entry = meta.tensors[name];
      if (!entry) return null;
      const [offset, shape] = entry;
      return all.subarray(offset, offset + shape.reduce((a, b) => a * b, 1));
    };
    const layers = Array.from({ length: meta.n_layers }, (_, l) => {
      const p = `trf_blocks.${l}.`;
      return {
        norm1: [t(`${p}norm1.scale`), t(`${p}norm1.shift`)],
        wq: [t(`${p}att.W_query.weight`), t(`${p}att.W_query.bias`)],
        wk: [t(`${p}att.W_key.weight`), t(`${p}att.W_key.bias`)],
        wv: [t(`${p}att.W_value.weight`), t(`${p}att.W_value.bias`)],
        wo: [t(`${p}att.out_proj.weight`), t(`${p}att.out_proj.bias`)],
        norm2: [t(`${p}norm2.scale`), t(`${p}norm2.shift`)],
        ff1: [t(`${p}ff.layers.0.weight`), t(`${p}ff.layers.0.bias`)],
        ff2: [t(`${p}ff.layers.2.weight`), t(`${p}ff.layers.2.bias`)],
      };
    });
    return {
      meta, layers, tok: t("tok_emb.weight"), pos: t("pos_emb.weight"),
      norm: [t("final_norm.scale"), t("final_norm.shift")],
      head: [t("out_head.weight"), t("out_head.bias")],
    };
  }

  /* y = x W^T + b: x (T, n_in), W (n_out, n_in) as PyTorch stores it, b (n_out) or null.
     Two rows of x at a time, two running sums each (even and odd inputs): every row is summed
     in the same order, paired or alone, and each weight is read once per pair of rows. */
  function linear(x, T, [W, b], nIn) {
    const nOut = W.length / nIn;
    const y = new Float64Array(T * nOut);
    const even = nIn - (nIn % 2), odd = nIn % 2 === 1; // pairs of inputs, then the last
    let t = 0;
    for (; t + 1 < T; t += 2) { // two rows at a time: each weight read once for both
      const xa = t * nIn, xb = xa + nIn;
      for (let o = 0; o < nOut; o++) {
        const wo = o * nIn;
        let a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        for (let i = 0; i < even; i += 2) {
          const w0 = W[wo + i], w1 = W[wo + i + 1];
          a0 += x[xa + i] * w0;
          a1 += x[xa + i + 1] * w1;
          b0 += x[xb + i] * w0;
          b1 += x[xb + i + 1] * w1;
        }
        if (odd) {
          a0 += x[xa + even] * W[wo + even];
          b0 += x[xb + even] * W[wo + even];
        }
        const bias = b ? b[o] : 0;
        y[t * nOut + o] = bias + (a0 + a1);
        y[(t + 1) * nOut + o] = bias + (b0 + b1);
      }
    }
    for (; t < T; t++) {
      const xo = t * nIn;
      for (let o = 0; o < nOut; o++) {
        const wo = o * nIn;
        let s0 = 0, s1 = 0;
        for (let i = 0; i < even; i += 2) {
          s0 += x[xo + i] * W[wo + i];
          s1 += x[xo + i + 1] * W[wo + i + 1];
        }
        if (odd) s0 += x[xo + even] * W[wo + even];
        y[t * nOut + o] = (b ? b[o] : 0) + (s0 + s1);
      }
    }
    return y;
  }

  /* LayerNorm over each row: scale * (x - mean) / sqrt(var + eps) + shift (biased var). */
  function layerNorm(x, T, d, [scale, shift], eps) {
    const y = new Float64Array(T * d);
    for (let t = 0; t < T; t++) {
      let mean = 0, variance = 0;
      for (let i = 0; i < d; i++) mean += x[t * d + i];
      mean /= d;
      for (let i = 0; i < d; i++) variance += (x[t * d + i] - mean) ** 2;
      const inv = 1 / Math.sqrt(variance / d + eps);
      for (let i = 0; i < d; i++) y[t * d + i] = (x[t * d + i] - mean) * inv * scale[i] + shift[i];
    }
    return y;
  }

  /* GPT-2's GELU, the tanh approximation. */
  const gelu = (x) => 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));

  /* Turn each head's pairs (i, i + d_h/2) of row t by t * theta_i, in place: x (T, heads * d_h). */
  function rope(x, T, heads, dh, base) {
    const half = dh / 2;
    for (let i = 0; i < half; i++) {
      const theta = base ** (-2 * i / dh);
      for (let t = 0; t < T; t++) {
        const c = Math.cos(t * theta), s = Math.sin(t * theta);
        for (let h = 0; h < heads; h++) {
          const a = t * heads * dh + h * dh + i, b = a + half;
          const x1 = x[a], x2 = x[b];
          x[a] = x1 * c - x2 * s;
          x[b] = x2 * c + x1 * s;
        }
      }
    }
  }

  /* May query t see key s? The causal mask, the window and its sinks, the documents. */
  function visibility(settings, T) {
    const windowed = settings.mask === "window" || settings.mask === "sinks";
    const w = windowed ? settings.window : Infinity;
    const sinks = settings.mask === "sinks" ? settings.sinks : 0;
    const doc = (t) => (settings.mask === "documents" && t >= settings.split ? 1 : 0);
    const seen = new Uint8Array(T * T);
    for (let t = 0; t < T; t++) {
      for (let s = 0; s <= t; s++) {
        seen[t * T + s] = (t - s < w || s < sinks) && doc(t) === doc(s) ? 1 : 0;
      }
    }
    return seen;
  }

  /* A layer's queries, keys and values from its input h (T, d), rotated by RoPE. */
  function project(model, layer, h, T) {
    const { n_heads: H, n_kv_heads: Hkv, head_dim: dh, emb_dim: d, rope_base } = model.meta;
    const q = linear(h, T, layer.wq, d), k = linear(h, T, layer.wk, d);
    const v = linear(h, T, layer.wv, d);
    if (rope_base !== null) {
      rope(q, T, H, dh, rope_base);
      rope(k, T, Hkv, dh, rope_base);
    }
    return { q, k, v };
  }

  /* One layer's attention on its projections: every head's weights (H, T, T) and the merged
     context (T, H d_h). */
  function attention(model, { q, k, v }, T, settings, seen, ablated) {
    const { n_heads: H, n_kv_heads: Hkv, head_dim: dh } = model.meta;
    const scale = 1 / (Math.sqrt(dh) * settings.temperature);
    const weights = new Float64Array(H * T * T);
    const context = new Float64Array(T * H * dh);
    const row = new Float64Array(T);
    for (let head = 0; head < H; head++) {
      const g = Math.floor(head / (H / Hkv));
      for (let t = 0; t < T; t++) {
        let top = -Infinity;
        for (let s = 0; s <= t; s++) {
          if (!seen[t * T + s]) continue;
          let dot = 0;
          const qo = (t * H + head) * dh, ko = (s * Hkv + g) * dh;
          for (let i = 0; i < dh; i++) dot += q[qo + i] * k[ko + i];
          row[s] = dot * scale;
          if (row[s] > top) top = row[s];
        }
        let total = 0;
        for (let s = 0; s <= t; s++) {
          row[s] = seen[t * T + s] ? Math.exp(row[s] - top) : 0;
          total += row[s];
        }
        const w = weights.subarray((head * T + t) * T, (head * T + t + 1) * T);
        for (let s = 0; s <= t; s++) w[s] = row[s] / total;
        if (ablated.has(head)) continue; // knocked out: its context vector stays 0
        const c = (t * H + head) * dh;
        for (let s = 0; s <= t; s++) {
          if (w[s] === 0) continue;
          const vo = (s * Hkv + g) * dh, ws = w[s];
          for (let i = 0; i < dh; i++) context[c + i] += ws * v[vo + i];
        }
      }
    }
    return { weights, context };
  }

  /* The rest of a block after its attention, on T rows of the stream x (in place):
     x += out_proj(context); x += ff(norm2(x)). */
  function rest(model, layer, x, context, T) {
    const { emb_dim: d, n_heads: H, head_dim: dh, eps } = model.meta;
    const out = linear(context, T, layer.wo, H * dh);
    for (let i = 0; i < T * d; i++) x[i] += out[i]; // the residual stream
    const hidden = linear(layerNorm(x, T, d, layer.norm2, eps), T, layer.ff1, d);
    for (let i = 0; i < hidden.length; i++) hidden[i] = gelu(hidden[i]);
    const ff = linear(hidden, T, layer.ff2, hidden.length / T);
    for (let i = 0; i < T * d; i++) x[i] += ff[i];
  }

  /* The forward, for token ids and the reader's settings {mask, window, sinks, split,
     temperature, ablate: [[layer, head], ...]}: each layer's weights (H, T, T), and
     logitsAt(t), the logits (V) after token t. The last block's weights need every row, but
     the rest of it (out_proj, the feed-forward) and the vocabulary head run only for the
     positions asked for, once each: a row's arithmetic is the same either way. */
  function forward(model, ids, settings) {
    const { emb_dim: d, vocab_size: V, n_heads: H, head_dim: dh, eps } = model.meta;
    const T = ids.length;
    const x = new Float64Array(T * d);
    ids.forEach((id, t) => {
      for (let i = 0; i < d; i++) {
        x[t * d + i] = model.tok[id * d + i] + (model.pos ? model.pos[t * d + i] : 0);
      }
    });
    const seen = visibility(settings, T);
    const weights = [];
    const last = model.layers.length - 1;
    let context = null;
    model.layers.forEach((layer, l) => {
      const ablated = new Set(settings.ablate.filter(([at]) => at === l).map(([, head]) => head));
      // the first layer's projections depend on the tokens only: kept for the next call
      const key = ids.join(",");
      const qkv = l === 0 && model.first && model.first.key === key
        ? model.first : project(model, layer, layerNorm(x, T, d, layer.norm1, eps), T);
      if (l === 0) model.first = { key, ...qkv };
      const att = attention(model, qkv, T, settings, seen, ablated);
      weights.push(att.weights);
      if (l < last) rest(model, layer, x, att.context, T);
      else context = att.context;
    });
    const rows = new Map();
    const logitsAt = (t) => {
      if (!rows.has(t)) {
        const row = x.slice(t * d, (t + 1) * d);
        rest(model, model.layers[last], row, context.subarray(t * H * dh, (t + 1) * H * dh), 1);
        rows.set(t, linear(layerNorm(row, 1, d, model.norm, eps), 1, model.head, d));
      }
      return rows.get(t);
    };
    return { T, V, weights, seen, logitsAt };
  }

  /* Softmax of one position's logits: the next token's probabilities. */
  function probabilities(logits) {
    let top = -Infinity;
    for (const v of logits) if (v > top) top = v;
    const p = new Float64Array(logits.length);
    let total = 0;
    for (let i = 0; i < logits.length; i++) total += (p[i] = Math.exp(logits[i] - top));
    for (let i = 0; i < logits.length; i++) p[i] /= total;
    return p;
  }

  /* attention.lab.heads' two scores of one head's weights w (T, T) on ids: the mean weight on the
     previous token, and, over the queries whose token occurred before, the weight on the
     tokens that followed its earlier copies (NaN when no token repeats). */
  function headScores(w, ids) {
    const T = ids.length;
    let previous = 0;
    for (let t = 1; t < T; t++) previous += w[t * T + t - 1];
    let induction = 0, queries = 0;
    for (let t = 0; t < T; t++) {
      let on = 0, any = false;
      for (let s = 1; s <= t; s++) {
        if (ids[s - 1] === ids[t]) {
          on += w[t * T + s];
          any = true;
        }
      }
      if (any) {
        induction += on;
        queries++;
      }
    }
    return { previous: T > 1 ? previous / (T - 1) : NaN, induction: queries ? induction / queries : NaN };
  }

  /* Text to the model's token ids, the longest vocabulary entry first at each place; a stretch
     that matches no entry is kept as {id: null} (shown as unknown, never dropped). */
  function tokenize(vocab, text) {
    if (!vocab.index) {
      vocab.index = new Map(vocab.map((s, i) => [s, i]));
      vocab.longest = Math.max(...vocab.map((s) => s.length));
    }
    const pieces = [];
    let p = 0;
    while (p < text.length) {
      let found = null;
      for (let n = Math.min(vocab.longest, text.length - p); n > 0 && found === null; n--) {
        const id = vocab.index.get(text.slice(p, p + n));
        if (id !== undefined) found = { text: text.slice(p, p + n), id };
      }
      if (found === null) { // unknown: up to the next space, or a known token
        let end = p + 1;
        while (end < text.length && text[end] !== " " && !vocab.index.has(text[end])) end++;
        found = { text: text.slice(p, end), id: null };
      }
      const last = pieces[pieces.length - 1];
      if (found.id === null && last && last.id === null) last.text += found.text;
      else pieces.push(found);
      p += found.text.length;
    }
    return pieces;
  }

  window.attentionModel = { load, forward, probabilities, headScores, tokenize, visibility };
})();
