/* The attention explorer: draws every [data-attention-explorer] element that
 * attention.explorer.explorer_html wrote into a page.
 *
 * The element holds, as embedded JSON, the scaled scores S = QK^T / sqrt(d_h) that the site's
 * build computed for every layer, head and sentence (attention.explorer.explorer_data). This
 * script computes one step only: weights = softmax(S / temperature), with the model's mask
 * (-inf where the build's visibility rule hides a key, embedded as "hidden") when it is on. It
 * fetches nothing. Layers, heads and tokens are numbered from 0, as in the data and in the
 * page's Python. The explorer's state is mirrored in data attributes of the root element for
 * tests/browser/check_site.py: data-sentence (its name), data-layer, data-head, data-query,
 * data-key, data-causal ("true"/"false") and data-temperature.
 *
 * Speed: every control must redraw in well under 50 ms on a slow phone (the site check
 * measures it at 4x CPU throttling). So the T x T heatmap is one <canvas>, not T * T elements;
 * its labels, marks and the token strip are built once per sentence and then only updated
 * where something changed.
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
  const trimmed = (token) => shown(token).trim() || shown(token);
  const quoted = (token) => `\u201c${trimmed(token)}\u201d`;

  const make = (tag, attrs = {}, text = null) => {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
    if (text !== null) el.textContent = text;
    return el;
  };

  /* Set an element's text or attribute only when it changes: no needless style work. */
  const setText = (el, text) => {
    if (el.textContent !== text) el.textContent = text;
  };
  const setAttr = (el, name, value) => {
    if (el.getAttribute(name) !== value) el.setAttribute(name, value);
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

  /* softmax(scores / temperature) of each row into a flat Float64Array (NaN where masked). */
  const weights = (scores, temperature, hidden) => {
    const T = scores.length;
    const out = new Float64Array(T * T);
    for (let i = 0; i < T; i++) {
      const row = scores[i];
      let top = -Infinity;
      for (let j = 0; j < T; j++) if (!hidden(i, j) && row[j] / temperature > top) top = row[j] / temperature;
      let total = 0;
      for (let j = 0; j < T; j++) {
        const e = hidden(i, j) ? 0 : Math.exp(row[j] / temperature - top);
        out[i * T + j] = e;
        total += e;
      }
      for (let j = 0; j < T; j++) out[i * T + j] = hidden(i, j) ? NaN : out[i * T + j] / total;
    }
    return out;
  };

  /* A weight as a background layer: the heat colour at opacity w (times `top`, so a token's
   * text stays readable on its shade), over whatever lies beneath. */
  const heat = (w, top = 1) => {
    const colour = `color-mix(in srgb, var(--ax-heat) ${(100 * w * top).toFixed(1)}%, transparent)`;
    return `linear-gradient(${colour}, ${colour})`;
  };

  function setup(root) {
    root.dataset.ready = ""; // first: a setup that throws is not retried into a second copy
    // a redraw lays out and paints this box only, not the page around it
    root.style.contain = "layout paint style";
    root.style.willChange = "transform"; // its own layer: a redraw repaints nothing else
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
      `${id}-layer`, "Layer", Array.from({ length: data.n_layers }, (_, l) => `layer ${l}`));
    const [headBox, headSelect] = select(
      `${id}-head`, "Head", Array.from({ length: data.n_heads }, (_, h) => `head ${h}`));
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

    /* The heatmap: one canvas for the T x T weights, positioned labels and two marks. Its
       geometry (cell size, label font) is computed from the column's width by layout(). */
    const plot = make("div", { class: "ax-plot", role: "img" });
    plot.style.cssText = "display: block; position: relative; width: auto; max-width: none;";
    const canvas = make("canvas", { class: "ax-heatmap", "aria-hidden": "true" });
    canvas.style.cssText = "position: absolute; display: block; touch-action: none;";
    const keysTitle = make("div", { class: "ax-axis ax-axis-keys" }, "keys \u2192");
    const queriesTitle = make("div", { class: "ax-axis ax-axis-queries" }, "queries \u2193");
    const rowMark = make("div", { class: "ax-mark ax-mark-row" });
    const colMark = make("div", { class: "ax-mark ax-mark-col" });
    for (const el of [keysTitle, queriesTitle, rowMark, colMark]) el.style.position = "absolute";
    plot.append(keysTitle, queriesTitle, canvas, rowMark, colMark);
    scroll.replaceChildren(plot);
    const probe = make("span", { "aria-hidden": "true" }); // reads the palette's colours
    probe.style.cssText = "position: absolute; visibility: hidden; width: 0; height: 0;";
    plot.append(probe);

    let tokens = [], rowLabels = [], colLabels = [], current = null, T = 0;
    let geometry = null, shownRow = -1, shownCol = -1;

    /* The mask is the model's own (data.sentences[s].hidden, "1" = hidden), computed in
       Python by the layers' visibility rule: the page never re-derives it. */
    const hidden = (i, j) => state.causal && data.sentences[state.sentence].hidden[i][j] === "1";
    const weight = (i, j) => current[i * T + j]; // NaN: masked

    /* Each sentence's strip and labels, made the first time it is shown and kept: switching
       sentences swaps them in, and a resize moves them. */
    const made = new Map();
    let fontFamily = null, columnWidth = 0;
    function parts(k) {
      if (!made.has(k)) {
        const labels = data.sentences[k].tokens;
        const label = (cls, text) => {
          const el = make("div", { class: cls }, text);
          el.style.cssText = "position: absolute; overflow: hidden; text-overflow: ellipsis;";
          return el;
        };
        // the labels of each sentence stay in the page, those not shown with
        // content-visibility: hidden, which keeps their layout for the next time
        const layer = make("div", { class: "ax-labels", "aria-hidden": "true" });
        layer.style.cssText = "position: absolute; inset: 0; pointer-events: none;" +
          "content-visibility: hidden;";
        const colLabels = labels.map((text) => label("ax-col", trimmed(text)));
        const rowLabels = labels.map((text) => label("ax-row", trimmed(text)));
        layer.append(...colLabels, ...rowLabels);
        plot.append(layer);
        made.set(k, {
          layer, colLabels, rowLabels,
          laidOut: -1, // the column width its labels were placed for
        });
      }
      return made.get(k);
    }

    /* The strip's tokens, made once for the longest sentence: a sentence relabels them. */
    const pool = [];
    function strippedTokens(labels) {
      while (pool.length < labels.length) {
        const el = make("span", {
          class: "ax-token", tabindex: "0", role: "button", "aria-pressed": "false",
          "data-index": String(pool.length),
        });
        el.append(make("span", { class: "ax-text" }), make("span", { class: "ax-weight" }));
        pool.push(el);
      }
      const used = pool.slice(0, labels.length);
      used.forEach((el, i) => setText(el.firstChild, shown(labels[i])));
      return used;
    }

    /* The sentence changed: swap in the strip and the labels of its T tokens. */
    function build() {
      const { tokens: labels } = data.sentences[state.sentence];
      T = labels.length;
      state.pinned = T - 1;
      state.query = null;
      state.key = null;
      for (const el of [...rowLabels, ...colLabels, ...tokens]) {
        el.classList.remove("ax-on", "ax-query", "ax-key");
      }
      for (const cached of made.values()) cached.layer.style.contentVisibility = "hidden";
      const cached = parts(state.sentence);
      cached.layer.style.contentVisibility = "visible";
      ({ rowLabels, colLabels } = cached);
      const before = tokens;
      tokens = strippedTokens(labels);
      if (before.length !== tokens.length) {
        for (const el of pool.slice(tokens.length)) el.remove();
        strip.append(...tokens.slice(before.length));
      }
      shownRow = shownCol = -1;
      root.dataset.sentence = data.sentences[state.sentence].name;
      layout();
    }

    /* Cell size and labels for the column's width: every token's text where cells can be
       12 px or more, else (a phone) positions every few tokens, large enough to read. */
    function layout() {
      const width = columnWidth;
      const cached = parts(state.sentence);
      if (width !== cached.laidOut) place(cached, width);
      geometry = cached.geometry;
      const { cell, left, top, box, font } = geometry;
      plot.style.width = `${Math.ceil(left + box + 2)}px`; // the same for every sentence:
      plot.style.height = `${Math.ceil(top + box + 2)}px`; // choosing one moves nothing else
      plot.style.fontSize = `${font}px`;
      plot.style.lineHeight = "1";
      Object.assign(keysTitle.style, {
        left: `${left}px`, top: "0px", width: `${box}px`, fontSize: "11px", padding: "0",
      });
      Object.assign(queriesTitle.style, {
        left: "0px", top: geometry.words ? `${top - 14}px` : "0px", fontSize: "11px", padding: "0",
        whiteSpace: "nowrap",
      });
      const dpr = window.devicePixelRatio || 1;
      if (canvas.width !== Math.round(box * dpr)) { // (clears it: draw() follows)
        canvas.width = canvas.height = Math.round(box * dpr);
        Object.assign(canvas.style, {
          left: `${left}px`, top: `${top}px`, width: `${box}px`, height: `${box}px`,
        });
      }
      plot.dataset.labels = geometry.words ? "tokens" : `positions every ${geometry.every}`;
      plot.dataset.cell = String(cell);
    }

    /* One sentence's geometry for a column `width` px wide, and its labels placed. The cell
       size and the label margins are those of the longest sentence and the widest label of
       all: every sentence's heatmap starts at the same place, in a box of the same size. */
    const N = Math.max(...data.sentences.map((s) => s.tokens.length));
    const widestLabel = new Map(); // font px -> the widest label's width, of all sentences
    function place(cached, width, k = state.sentence) {
      cached.laidOut = width;
      const { colLabels, rowLabels } = cached;
      const labels = data.sentences[k].tokens;
      const T = labels.length; // (this sentence's, not necessarily the one shown)
      const measure = document.createElement("canvas").getContext("2d");
      const textWidth = (text, px) => {
        measure.font = `${px}px ${fontFamily}`;
        return measure.measureText(text).width;
      };
      const widest = (px) => {
        if (!widestLabel.has(px)) {
          let most = 0;
          for (const sentence of data.sentences) {
            for (const l of sentence.tokens) most = Math.max(most, textWidth(trimmed(l), px));
          }
          widestLabel.set(px, Math.min(6 * px, most));
        }
        return widestLabel.get(px);
      };
      const gap = 4;
      let words = true, font = 11, left = widest(11) + gap;
      let cell = Math.floor((width - left - 2) / N);
      if (cell < 12) { // too narrow for a label per token: positions, every `every`
        words = false;
        font = 11;
        left = textWidth(String(N - 1), font) + gap + 2;
        cell = Math.max(6, Math.floor((width - left - 2) / N));
      } else {
        cell = Math.min(22, cell);
        font = Math.min(12, Math.max(10, cell - 6));
        left = widest(font) + gap;
      }
      const every = words ? 1 : Math.ceil((font + 3) / cell);
      const top = 14 + (words ? Math.min(4.5 * font, widest(font)) : font) + gap;
      const size = cell * T, box = cell * N;
      cached.geometry = { cell, left, top, size, box, words, every, font };
      const shows = (k) => words || k % every === 0;
      colLabels.forEach((el, k) => {
        el.textContent = words ? trimmed(labels[k]) : String(k);
        el.style.display = shows(k) ? "" : "none";
        Object.assign(el.style, words ? {
          left: `${left + k * cell}px`, width: `${cell}px`, top: "14px", height: `${top - 14 - gap}px`,
          maxHeight: "none", padding: "0", writingMode: "vertical-rl", transform: "rotate(180deg)",
          textAlign: "left", whiteSpace: "pre",
        } : {
          left: `${left + k * cell + cell / 2 - 12}px`, width: "24px", top: `${top - gap - font}px`,
          height: `${font}px`, maxHeight: "none", padding: "0", writingMode: "horizontal-tb",
          transform: "none", textAlign: "center", whiteSpace: "pre",
        });
      });
      rowLabels.forEach((el, k) => {
        el.textContent = words ? trimmed(labels[k]) : String(k);
        el.style.display = shows(k) ? "" : "none";
        Object.assign(el.style, {
          left: "0px", width: `${left - gap}px`, maxWidth: "none", padding: "0",
          top: `${top + k * cell + cell / 2 - font / 2}px`, height: `${font}px`,
          textAlign: "right", whiteSpace: "pre",
        });
      });
    }

    /* The heat colour and the grid lines' colour, read from the palette once: reading a
       computed style in every redraw would force a style recalculation first. */
    let palette = null;
    function colours() {
      if (palette === null) {
        probe.style.color = "var(--ax-heat)";
        const heatColour = getComputedStyle(probe).color;
        probe.style.color = "var(--md-default-fg-color--lightest)";
        palette = { heatColour, line: getComputedStyle(probe).color };
      }
      return palette;
    }

    /* Paint every cell: the heat colour at opacity w; masked cells hatched. */
    function draw() {
      const { cell, size, box } = geometry;
      const dpr = canvas.width / box;
      const ctx = canvas.getContext("2d");
      const { heatColour, line } = colours();
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, box, box);
      ctx.fillStyle = heatColour;
      for (let i = 0; i < T; i++) {
        for (let j = 0; j < T; j++) {
          const w = weight(i, j);
          if (w > 0.002) {
            ctx.globalAlpha = Math.min(1, w);
            ctx.fillRect(j * cell, i * cell, cell, cell);
          }
        }
      }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = line;
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let i = 0; i < T; i++) {
        for (let j = 0; j < T; j++) {
          if (!Number.isNaN(weight(i, j))) continue;
          const x = j * cell, y = i * cell; // two diagonal strokes: the masked hatch
          ctx.moveTo(x, y + cell / 2);
          ctx.lineTo(x + cell / 2, y);
          ctx.moveTo(x, y + cell);
          ctx.lineTo(x + cell, y);
        }
      }
      for (let k = 0; k <= T; k++) { // the grid
        ctx.moveTo(k * cell, 0);
        ctx.lineTo(k * cell, size);
        ctx.moveTo(0, k * cell);
        ctx.lineTo(size, k * cell);
      }
      ctx.stroke();
    }

    /* The layer, head, mask or temperature changed: recompute the weights, repaint. */
    function update() {
      const scores = data.sentences[state.sentence].scores[state.layer][state.head];
      current = weights(scores, state.temperature, hidden);
      draw();
      const t = state.temperature.toFixed(2);
      setText(tempValue, `\u03c4 = ${t}`);
      setAttr(temp, "aria-valuetext", `temperature ${t}`);
      setAttr(plot, "aria-label",
        `Attention weights of layer ${state.layer}, head ${state.head} at temperature ${t}` +
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
      let j = state.key;
      if (j === null) {
        j = 0;
        for (let k = 1; k < T; k++) if (weight(i, k) > (weight(i, j) || -1)) j = k;
      }
      const labels = data.sentences[state.sentence].tokens;
      const { cell, left, top, size } = geometry;
      Object.assign(rowMark.style, {
        left: `${left}px`, top: `${top + i * cell}px`, width: `${size}px`, height: `${cell}px`,
      });
      Object.assign(colMark.style, {
        left: `${left + j * cell}px`, top: `${top}px`, width: `${cell}px`, height: `${size}px`,
      });
      if (shownRow !== i) {
        rowLabels[shownRow]?.classList.remove("ax-on");
        rowLabels[i].classList.add("ax-on");
        tokens[shownRow]?.classList.remove("ax-query");
        tokens[i].classList.add("ax-query");
        shownRow = i;
      }
      if (shownCol !== j) {
        colLabels[shownCol]?.classList.remove("ax-on");
        colLabels[j].classList.add("ax-on");
        tokens[shownCol]?.classList.remove("ax-key");
        tokens[j].classList.add("ax-key");
        shownCol = j;
      }
      tokens.forEach((el, k) => {
        const w = weight(i, k);
        const masked = Number.isNaN(w);
        const text = masked ? "\u2013" : w.toFixed(2);
        if (el.lastChild.textContent === text && el.dataset.masked === String(masked)) {
          setAttr(el, "aria-pressed", String(k === state.pinned));
          return; // the same weight to two decimals: nothing to redraw
        }
        el.dataset.masked = String(masked);
        el.classList.toggle("ax-masked", masked);
        setAttr(el, "aria-pressed", String(k === state.pinned));
        el.style.backgroundImage = masked ? "" : heat(w, 0.6);
        el.lastChild.textContent = text;
        el.setAttribute("aria-label", `token ${k} ${quoted(labels[k])}` +
          (masked ? ", masked" : `, weight ${text}`));
      });
      const w = weight(i, j);
      const shownWeight = Number.isNaN(w) ? "masked, weight 0" : w.toFixed(2);
      setText(caption, `Layer ${state.layer}, head ${state.head}: query ${i} ` +
        `${quoted(labels[i])} \u2192 key ${j} ${quoted(labels[j])}: ${shownWeight}` +
        (state.key === null ? " (its largest weight)" : ""));
      root.dataset.query = String(i);
      root.dataset.key = String(j);
    }

    function choose(query, key) {
      if (query === state.query && key === state.key) return;
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
    canvas.addEventListener("pointermove", (event) => {
      const box = canvas.getBoundingClientRect();
      const at = (v) => Math.floor((v / box.width) * N); // cells are square, N to a side
      const i = at(event.clientY - box.top), j = at(event.clientX - box.left);
      if (i >= 0 && j >= 0 && i < T && j < T) choose(i, j);
      else release();
    });
    canvas.addEventListener("pointerleave", release);
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
    // a new column width (phone rotated, window resized): new cells and labels, next frame
    new ResizeObserver((entries) => requestAnimationFrame(() => {
      const width = Math.floor(entries[entries.length - 1].contentRect.width);
      if (width === columnWidth) return;
      columnWidth = width;
      layout();
      draw();
      focusRow();
    })).observe(scroll);
    // the palette switched (light / dark): the heat colour may have changed
    new MutationObserver(() => {
      palette = null;
      draw();
    }).observe(document.body,
      { attributes: true, attributeFilter: ["data-md-color-scheme", "data-md-color-primary"] });

    fontFamily = getComputedStyle(root).fontFamily; // one style read, before any drawing
    columnWidth = scroll.clientWidth;
    build();
    update();
    // the other sentences' strips and labels, made and measured while the reader reads, so
    // that choosing one only swaps them in
    const idle = window.requestIdleCallback || ((work) => setTimeout(work, 200));
    data.sentences.forEach((_, k) => idle(() => {
      const cached = parts(k);
      if (cached.laidOut !== columnWidth) place(cached, columnWidth, k);
    }));
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
