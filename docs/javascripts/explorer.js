/* The attention explorer: draws every [data-attention-explorer] element that
 * attention.explorer.explorer_html wrote into a page.
 *
 * The element holds, as embedded JSON, the scaled scores S = QK^T / sqrt(d_h) that the site's
 * build computed for every layer, head and sentence (attention.explorer.explorer_data). This
 * script computes one step only: weights = softmax(S / temperature), with the model's mask
 * (-inf where the build's visibility rule hides a key, embedded as "hidden") when it is on. It
 * fetches nothing. The explorer's state is mirrored in data attributes of the root element
 * for tests/browser/check_site.py: data-sentence (its name), data-layer, data-head, data-query
 * and data-key (indices from 0, as in the data; the page counts layers and heads from 1),
 * data-causal ("true"/"false") and data-temperature.
 *
 * Plain JavaScript; it runs on DOMContentLoaded and, with Material's instant navigation, on
 * every page change (document$). An element is drawn once (data-ready).
 */
(() => {
  "use strict";

  let counter = 0;

  /* A token's text as drawn: line breaks and tabs visible, a blank token as an open box. */
  const shown = (token) => {
    const text = token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
    return text.trim() === "" ? "\u2423".repeat(Math.max(1, text.length)) : text;
  };
  const quoted = (token) => `\u201c${shown(token).trim() || shown(token)}\u201d`;

  const make = (tag, attrs = {}, text = null) => {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
    if (text !== null) el.textContent = text;
    return el;
  };

  /* A labelled <select> of `options` (value: index). */
  const select = (id, label, options) => {
    const wrap = make("div", { class: "ax-control" });
    wrap.append(make("label", { for: id }, label));
    const el = make("select", { id });
    options.forEach((text, i) => el.append(make("option", { value: String(i) }, text)));
    wrap.append(el);
    return [wrap, el];
  };

  /* softmax(scores / temperature) of each row, masked entries -> 0; null where masked. */
  const weights = (scores, temperature, hidden) =>
    scores.map((row, i) => {
      const logits = row.map((s, j) => (hidden(i, j) ? -Infinity : s / temperature));
      const top = Math.max(...logits);
      const e = logits.map((v) => (v === -Infinity ? 0 : Math.exp(v - top)));
      const total = e.reduce((a, b) => a + b, 0);
      return e.map((v, j) => (hidden(i, j) ? null : v / total));
    });

  /* A weight as a background layer: the heat colour at opacity w (times `top`, so a token's
   * text stays readable on its shade), over whatever lies beneath. */
  const heat = (w, top = 1) => {
    const colour = `color-mix(in srgb, var(--ax-heat) ${(100 * w * top).toFixed(1)}%, transparent)`;
    return `linear-gradient(${colour}, ${colour})`;
  };

  function setup(root) {
    root.dataset.ready = ""; // first: a setup that throws is not retried into a second copy
    const source = root.querySelector("script.attention-explorer__data");
    const data = JSON.parse(source.textContent);
    const id = `ax-${++counter}`;
    const state = {
      sentence: 0, layer: 0, head: 0, causal: Boolean(data.causal), temperature: 1,
      pinned: null, query: null, key: null,
    };

    // --- controls -------------------------------------------------------------------------
    const controls = make("div", { class: "ax-controls" });
    const [sentenceBox, sentenceSelect] = select(
      `${id}-sentence`, "Sequence", data.sentences.map((s) => s.name));
    const [layerBox, layerSelect] = select(
      `${id}-layer`, "Layer", Array.from({ length: data.n_layers }, (_, l) => `layer ${l + 1}`));
    const [headBox, headSelect] = select(
      `${id}-head`, "Head", Array.from({ length: data.n_heads }, (_, h) => `head ${h + 1}`));
    const maskBox = make("div", { class: "ax-control ax-check" });
    const mask = make("input", { type: "checkbox", id: `${id}-causal` });
    mask.checked = state.causal;
    const maskText = data.window ? `causal mask (window ${data.window})` : "causal mask";
    maskBox.append(mask, make("label", { for: `${id}-causal` }, maskText));
    const tempBox = make("div", { class: "ax-control ax-temperature" });
    const temp = make("input", {
      type: "range", id: `${id}-temperature`, min: "-2", max: "2", step: "0.05", value: "0",
    });
    const tempValue = make("output", { for: `${id}-temperature`, class: "ax-value" });
    tempBox.append(make("label", { for: `${id}-temperature` }, "Temperature"), temp, tempValue);
    controls.append(sentenceBox, layerBox, headBox, maskBox, tempBox);

    // --- token strip, caption, heatmap ----------------------------------------------------
    const hint = make("p", { class: "ax-hint", id: `${id}-hint` },
      "Pick a query: hover a token or a row, or focus a token (Tab, then \u2190 \u2192) and " +
      "press Enter to pin it. Each key is shaded by the weight the query puts on it.");
    const strip = make("div", {
      class: "ax-strip", role: "group", "aria-label": "Tokens (queries)",
      "aria-describedby": `${id}-hint`,
    });
    const caption = make("p", { class: "ax-caption", "aria-live": "polite" });
    const scroll = make("div", { class: "ax-scroll" });
    const legend = make("p", { class: "ax-legend", "aria-hidden": "true" });
    legend.append(make("span", {}, "weight 0"), make("span", { class: "ax-ramp" }),
      make("span", {}, "1"), make("span", { class: "ax-cell ax-masked ax-swatch" }),
      make("span", {}, "masked"));
    const figure = make("div", { class: "ax-figure" });
    figure.append(scroll, legend);
    root.querySelector(".attention-explorer__fallback")?.remove();
    root.append(controls, hint, strip, caption, figure);

    let cells = [], tokens = [], rowLabels = [], colLabels = [], rowMark, colMark, current;

    /* The mask is the model's own (data.sentences[s].hidden, "1" = hidden), computed in
       Python by the layers' visibility rule: the page never re-derives it. */
    const hidden = (i, j) => state.causal && data.sentences[state.sentence].hidden[i][j] === "1";

    /* The sentence changed: rebuild the strip and the grid for its T tokens. */
    function build() {
      const { tokens: labels } = data.sentences[state.sentence];
      const T = labels.length;
      state.pinned = T - 1;
      state.query = null;
      state.key = null;
      strip.replaceChildren();
      tokens = labels.map((label, i) => {
        const el = make("span", {
          class: "ax-token", tabindex: "0", role: "button", "aria-pressed": "false",
          "data-index": String(i),
        });
        el.append(make("span", { class: "ax-text" }, shown(label)),
          make("span", { class: "ax-weight" }));
        strip.append(el);
        return el;
      });
      const grid = make("div", { class: "ax-grid", role: "img" });
      grid.style.setProperty("--ax-n", String(T));
      grid.append(make("div", { class: "ax-axis ax-axis-keys" }, "keys \u2192"),
        make("div", { class: "ax-axis ax-axis-queries" }, "queries \u2193"));
      colLabels = labels.map((label, j) => {
        const el = make("div", { class: "ax-col" }, shown(label).trim() || shown(label));
        el.style.gridColumn = String(j + 2);
        grid.append(el);
        return el;
      });
      rowLabels = [];
      cells = labels.map((label, i) => {
        const head = make("div", { class: "ax-row" }, shown(label).trim() || shown(label));
        head.style.gridRow = String(i + 3);
        grid.append(head);
        rowLabels.push(head);
        return labels.map((_, j) => {
          const cell = make("div", { class: "ax-cell", "data-i": String(i), "data-j": String(j) });
          cell.style.gridRow = String(i + 3);
          cell.style.gridColumn = String(j + 2);
          grid.append(cell);
          return cell;
        });
      });
      rowMark = make("div", { class: "ax-mark ax-mark-row" });
      colMark = make("div", { class: "ax-mark ax-mark-col" });
      grid.append(rowMark, colMark);
      grid.addEventListener("pointerover", (event) => {
        const cell = event.target.closest(".ax-cell");
        if (cell) choose(Number(cell.dataset.i), Number(cell.dataset.j));
      });
      grid.addEventListener("pointerleave", release);
      scroll.replaceChildren(grid);
      root.dataset.sentence = data.sentences[state.sentence].name;
    }

    /* The layer, head, mask or temperature changed: recompute the weights, recolour. */
    function update() {
      const scores = data.sentences[state.sentence].scores[state.layer][state.head];
      current = weights(scores, state.temperature, hidden);
      current.forEach((row, i) => row.forEach((w, j) => {
        const cell = cells[i][j];
        cell.classList.toggle("ax-masked", w === null);
        cell.style.backgroundImage = w === null ? "" : heat(w);
      }));
      const t = state.temperature.toFixed(2);
      tempValue.textContent = `\u03c4 = ${t}`;
      temp.setAttribute("aria-valuetext", `temperature ${t}`);
      scroll.firstChild.setAttribute("aria-label",
        `Attention weights of layer ${state.layer + 1}, head ${state.head + 1} ` +
        `at temperature ${t}` +
        `${state.causal ? ", causal mask on" : ", no mask"}: rows are queries, columns keys. ` +
        "The token strip above reads them out one query at a time.");
      Object.assign(root.dataset, {
        layer: String(state.layer), head: String(state.head), causal: String(state.causal),
        temperature: t,
      });
      focusRow();
    }

    /* Show query (hovered, focused or pinned) and key (hovered, else its largest weight). */
    function focusRow() {
      const i = state.query ?? state.pinned;
      const row = current[i];
      const j = state.key ??
        row.reduce((best, w, k) => (w !== null && w > (row[best] ?? -1) ? k : best), 0);
      const T = row.length;
      const labels = data.sentences[state.sentence].tokens;
      rowMark.style.gridRow = String(i + 3);
      rowMark.style.gridColumn = `2 / span ${T}`;
      colMark.style.gridColumn = String(j + 2);
      colMark.style.gridRow = `3 / span ${T}`;
      rowLabels.forEach((el, k) => el.classList.toggle("ax-on", k === i));
      colLabels.forEach((el, k) => el.classList.toggle("ax-on", k === j));
      tokens.forEach((el, k) => {
        const w = row[k];
        el.classList.toggle("ax-query", k === i);
        el.classList.toggle("ax-key", k === j);
        el.classList.toggle("ax-masked", w === null);
        el.setAttribute("aria-pressed", String(k === state.pinned));
        el.style.backgroundImage = w === null ? "" : heat(w, 0.6);
        el.lastChild.textContent = w === null ? "\u2013" : w.toFixed(2);
        el.setAttribute("aria-label", `token ${k + 1} ${quoted(labels[k])}` +
          (w === null ? ", masked" : `, weight ${w.toFixed(2)}`));
      });
      const weight = row[j] === null ? "masked, weight 0" : row[j].toFixed(2);
      caption.textContent = `Layer ${state.layer + 1}, head ${state.head + 1}: query ${i + 1} ` +
        `${quoted(labels[i])} \u2192 key ${j + 1} ${quoted(labels[j])}: ${weight}` +
        (state.key === null ? " (its largest weight)" : "");
      root.dataset.query = String(i);
      root.dataset.key = String(j);
    }

    function choose(query, key) {
      state.query = query;
      state.key = key;
      focusRow();
    }

    /* The pointer left: back to the focused token if there is one, else the pinned one. */
    function release() {
      const el = document.activeElement;
      choose(strip.contains(el) && el.dataset.index ? Number(el.dataset.index) : null, null);
    }

    // --- events -----------------------------------------------------------------------------
    sentenceSelect.addEventListener("change", () => {
      state.sentence = Number(sentenceSelect.value);
      build();
      update();
    });
    layerSelect.addEventListener("change", () => {
      state.layer = Number(layerSelect.value);
      update();
    });
    headSelect.addEventListener("change", () => {
      state.head = Number(headSelect.value);
      update();
    });
    mask.addEventListener("change", () => {
      state.causal = mask.checked;
      update();
    });
    temp.addEventListener("input", () => {
      state.temperature = 2 ** Number(temp.value);
      update();
    });
    const token = (event) => event.target.closest(".ax-token");
    strip.addEventListener("pointerover", (event) => {
      if (token(event)) choose(Number(token(event).dataset.index), null);
    });
    strip.addEventListener("pointerleave", release);
    strip.addEventListener("focusin", (event) => {
      if (token(event)) choose(Number(token(event).dataset.index), null);
    });
    strip.addEventListener("focusout", (event) => {
      if (!strip.contains(event.relatedTarget)) choose(null, null);
    });
    strip.addEventListener("keydown", (event) => {
      const el = token(event);
      if (!el) return;
      const i = Number(el.dataset.index);
      const next = { ArrowRight: i + 1, ArrowDown: i + 1, ArrowLeft: i - 1, ArrowUp: i - 1,
        Home: 0, End: tokens.length - 1 }[event.key];
      if (next !== undefined) {
        event.preventDefault();
        tokens[Math.max(0, Math.min(tokens.length - 1, next))].focus();
      } else if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        state.pinned = i;
        focusRow();
      }
    });
    strip.addEventListener("click", (event) => {
      if (token(event)) {
        state.pinned = Number(token(event).dataset.index);
        focusRow();
      }
    });

    build();
    update();
  }

  function setupAll() {
    for (const root of document.querySelectorAll("[data-attention-explorer]:not([data-ready])")) {
      setup(root);
    }
  }

  if (typeof window.document$ !== "undefined" && window.document$.subscribe) {
    window.document$.subscribe(setupAll); // Material: every page, instant navigation or not
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setupAll);
  } else {
    setupAll();
  }
})();
