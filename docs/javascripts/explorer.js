/* The attention explorer: draws every [data-attention-explorer] element that
 * attention_site.explorer.explorer_html wrote into a page, and runs its model in the browser.
 *
 * The element holds the model's configuration, vocabulary and preset sequences as JSON, and
 * names the weights file the build wrote beside the site's pages ("model"), which this script
 * fetches from the site itself. model.js (window.attentionModel) runs the forward pass on the
 * reader's sequence, under the reader's mask, temperature and knocked-out head; this file draws
 * it: the token strip, one head's T x T weights, every head's previous-token and induction
 * scores, and the next-token prediction. Layers, heads and tokens are numbered from 0.
 *
 * The page also says what the model can do, as explorer_html measured it: the head shown first
 * ("view"), the longest sequence ("max_tokens", what the model was trained on) and, for a model
 * that learned to continue repeats, the typed lengths the Repeat button takes ("repeat"); with
 * it, the prediction panel says where the query's token occurred before and whether the mask
 * hides that copy.
 *
 * The explorer's state is mirrored in data attributes of the root element for
 * tests/browser/check_site.py: data-tokens (the ids, comma-separated), data-layer, data-head,
 * data-mask, data-temperature, data-ablate ("layer,head;..." knocked out), data-query, data-key,
 * data-prediction (the top next-token id after the query: intact, and with the knocked-out
 * heads), data-probability (the intact top token's probability, intact and knocked out) and
 * data-copies ("earlier copies of the query's token, how many of them the mask hides").
 *
 * Speed: every control must redraw in well under 50 ms at 4x CPU throttling (the site check
 * measures it). The heatmap is one <canvas>; a forward runs only when the sequence, the mask,
 * the temperature or the knocked-out head changes, never for the layer, the head or a hover.
 */
(() => {
  "use strict";

  let counter = 0;
  const scriptUrl = document.currentScript ? document.currentScript.src : document.baseURI;

  /* A token's text as drawn: line breaks and tabs visible, a blank token as an open box. */
  const shown = (token) => {
    const text = token.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
    return text.trim() === "" ? "\u2423".repeat(Math.max(1, text.length)) : text;
  };
  const trimmed = (token) => shown(token).trim() || shown(token);
  const quoted = (token) => `\u201c${trimmed(token)}\u201d`;
  /* A token in the "Add a token" list: a leading space shown, so " A" and "A" differ. */
  const spaced = (token) => shown(token).replace(/^ /, "\u2423");
  /* The text box shows line breaks and tabs as the strip does, and reads them back. */
  const typed = (text) => text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  const untyped = (text) => text.replace(/\u21b5/g, "\n").replace(/\u21e5/g, "\t");

  const make = (tag, attrs = {}, text = null) => {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) el.setAttribute(name, value);
    if (text !== null) el.textContent = text;
    return el;
  };
  const setText = (el, text) => {
    if (el.textContent !== text) el.textContent = text;
  };

  /* A labelled control: <label> over the element. */
  const control = (id, label, el, cls = "") => {
    const wrap = make("div", { class: `ax-control ${cls}`.trim() });
    el.id = id;
    wrap.append(make("label", { for: id }, label), el);
    return wrap;
  };
  const options = (el, items) => {
    el.replaceChildren(...items.map(([value, text]) => make("option", { value }, text)));
    return el;
  };

  /* A weight as a background colour: the heat colour at opacity w (times `top`, so the text
     on it stays readable). A plain colour, not a gradient: the cheapest thing to paint. */
  const heat = (w, top = 1) => `color-mix(in srgb, var(--ax-heat) ${(100 * w * top).toFixed(1)}%, transparent)`;

  function setup(root) {
    root.dataset.ready = ""; // first: a setup that throws is not retried into a second copy
    root.style.contain = "layout paint style"; // a redraw lays out and paints this box only
    root.style.willChange = "transform"; // its own layer: a redraw repaints nothing else
    const data = JSON.parse(root.querySelector("script.attention-explorer__data").textContent);
    const AM = window.attentionModel;
    const id = `ax-${++counter}`;
    const { n_layers: L, n_heads: H, vocab, context_length: context } = data;
    // the longest sequence it takes (what the model was trained on), the head shown first,
    // and the typed lengths Repeat takes (the periods the model learned to repeat), or null
    const maxT = data.max_tokens || context;
    const view = data.view || { layer: 0, head: 0 };
    const range = data.repeat || null;
    // the heatmap's side in cells for any shorter sequence (the longest preset's length):
    // a new sequence up to it moves nothing on the page
    const SIDE = Math.max(...data.presets.map((p) => p.ids.length));
    const state = {
      ids: data.presets[0].ids.slice(), unknown: [], layer: view.layer, head: view.head,
      ...data.defaults,
      pinned: null, query: null, key: null,
    };
    let model = null, run = null, intact = null, T = 0;
    // a word model's tokens carry their leading space (" lamp"): a typed first word gets one
    const words = vocab.some((s) => s.length > 1 && s.startsWith(" "));
    // In the text box, JOIN marks a boundary between tokens that has no space: two tokens
    // that meet inside a run of letters or digits ("around" then "Slow": "around\u00b7Slow",
    // which without it reads as one word, and typed back could be read as other tokens), and
    // a first token without a leading space (typing gives a first word one). Typing reads
    // JOIN as that boundary. None for a model of characters, or one whose vocabulary holds it.
    const JOIN = words && !vocab.some((s) => s.includes("\u00b7")) ? "\u00b7" : "";
    const glued = (a, b) => /[\p{L}\p{N}]$/u.test(a) && /^[\p{L}\p{N}]/u.test(b);
    const boxText = (ids) => typed(ids.map((k, n) => {
      const mark = JOIN && (n ? glued(vocab[ids[n - 1]], vocab[k]) : !/^\s/.test(vocab[k]));
      return (mark ? JOIN : "") + vocab[k];
    }).join(""));

    // --- controls -------------------------------------------------------------------------
    const input = make("input", { type: "text", autocomplete: "off", spellcheck: "false" });
    const preset = options(make("select"), data.presets.map((p, k) => [String(k), p.name]));
    const ADD = "add a token\u2026";
    const picker = options(make("select"), [["", ADD],
      ...vocab.map((s, k) => [String(k), spaced(s)]).sort((a, b) => a[1].localeCompare(b[1]))]);
    const repeat = make("button", { type: "button", class: "md-button ax-button",
      "aria-describedby": `${id}-range` }, "Repeat what I typed");
    const layerSel = options(make("select"),
      Array.from({ length: L }, (_, l) => [String(l), `layer ${l}`]));
    const headSel = options(make("select"),
      Array.from({ length: H }, (_, h) => [String(h), `head ${h}`]));
    const maskSel = options(make("select"), [["causal", "causal"], ["window", "window"],
      ["sinks", "window + sinks"], ["documents", "two documents"]]);
    const number = (min) => make("input", { type: "number", min: String(min), step: "1" });
    const windowIn = number(1), sinksIn = number(0), splitIn = number(0);
    const temp = make("input", { type: "range", min: "-2", max: "2", step: "0.25", value: "0" });
    const tempValue = make("output", { for: `${id}-temperature`, class: "ax-value" });

    const sequenceRow = make("div", { class: "ax-controls ax-sequence" });
    sequenceRow.append(
      control(`${id}-text`, "Your sequence (type, or start from one below)", input, "ax-wide"),
      control(`${id}-preset`, "Start from", preset), control(`${id}-add`, "Add a token", picker),
      ...(range ? [repeat] : []));
    // what the model was trained on, said where the reader types
    const limits = make("p", { class: "ax-hint", id: `${id}-range` }, (range
      ? `The model learned to continue repeats of ${range[0]} to ${range[1]} tokens, in ` +
        `sequences of ${maxT}: Repeat takes ${range[0]} to ${range[1]} tokens, and a sequence ` +
        `keeps its first ${maxT}.`
      : `A sequence keeps its first ${maxT} tokens, the model's context.`) +
      (JOIN ? ` In the box, ${JOIN} marks where two tokens meet with no space between them.` : ""));
    const tempBox = control(`${id}-temperature`, "Temperature \u03c4", temp, "ax-temperature");
    tempBox.append(tempValue);
    const windowBox = control(`${id}-window`, "window w", windowIn, "ax-number");
    const sinksBox = control(`${id}-sinks`, "sinks", sinksIn, "ax-number");
    const splitBox = control(`${id}-split`, "document 1 starts at token", splitIn, "ax-number");
    const viewRow = make("div", { class: "ax-controls" });
    viewRow.append(control(`${id}-layer`, "Layer", layerSel), control(`${id}-head`, "Head", headSel),
      control(`${id}-mask`, "Mask", maskSel), windowBox, sinksBox, splitBox, tempBox);

    // --- strip, caption, heatmap, scores, prediction ---------------------------------------
    const notice = make("p", { class: "ax-notice", "aria-live": "polite" });
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
    const panels = make("div", { class: "ax-panels" });
    const scores = make("table", { class: "ax-scores" });
    const scoreCells = []; // [layer * H + head] -> {row, previous, induction, knock}
    {
      const head = make("tr");
      for (const text of ["head", "previous-token", "induction", "knock out"]) {
        head.append(make("th", { scope: "col" }, text));
      }
      scores.append(make("caption", {}, "Each head on your sequence (a head's name shows it; " +
        "knocking a head out removes its output, its own weights stay)"), head);
      for (let k = 0; k < L * H; k++) {
        const [l, h] = [Math.floor(k / H), k % H];
        const row = make("tr");
        const th = make("th", { scope: "row" });
        th.append(make("button", { type: "button", class: "ax-pick", "data-layer": String(l),
          "data-head": String(h) }, `layer ${l}, head ${h}`));
        const knock = make("input", { type: "checkbox", id: `${id}-knock-${l}-${h}`,
          "data-layer": String(l), "data-head": String(h) });
        const box = make("td");
        box.append(knock, make("label", { for: knock.id, class: "ax-sr" },
          `knock out layer ${l}, head ${h}`));
        const previous = make("td"), induction = make("td");
        row.append(th, previous, induction, box);
        scores.append(row);
        scoreCells.push({ row, previous, induction, knock });
      }
    }
    const prediction = make("div", { class: "ax-prediction", "aria-live": "polite" });
    panels.append(scores, prediction);
    root.querySelector(".attention-explorer__fallback")?.remove();
    root.append(sequenceRow, limits, notice, viewRow, hint, strip, caption, figure, panels);

    const plot = make("div", { class: "ax-plot", role: "img" });
    plot.style.cssText = "display: block; position: relative; contain: strict;"; // sized below
    // two canvases: the weights, under the mask's hatch and the grid (redrawn only when the
    // mask or the sequence changes); the upper one takes the pointer
    const cellsCanvas = make("canvas", { class: "ax-cells", "aria-hidden": "true" });
    const canvas = make("canvas", { class: "ax-heatmap", "aria-hidden": "true" });
    for (const c of [cellsCanvas, canvas]) {
      c.style.cssText = "position: absolute; display: block; touch-action: none;";
    }
    const keysTitle = make("div", { class: "ax-axis" }, "keys \u2192");
    const queriesTitle = make("div", { class: "ax-axis" }, "queries \u2193");
    const rowMark = make("div", { class: "ax-mark ax-mark-row" });
    const colMark = make("div", { class: "ax-mark ax-mark-col" });
    const labelLayer = make("div", { class: "ax-labels", "aria-hidden": "true" });
    labelLayer.style.cssText = "position: absolute; inset: 0; pointer-events: none;";
    for (const el of [keysTitle, queriesTitle, rowMark, colMark]) el.style.position = "absolute";
    plot.append(keysTitle, queriesTitle, cellsCanvas, canvas, rowMark, colMark, labelLayer);
    scroll.append(plot);
    const probe = make("span", { "aria-hidden": "true" });
    probe.style.cssText = "position: absolute; visibility: hidden; width: 0; height: 0;";
    plot.append(probe);

    let tokens = [], rowLabels = [], colLabels = [], geometry = null, columnWidth = 0;
    const fontFamily = getComputedStyle(root).fontFamily;
    const weights = () => run.weights[state.layer].subarray(state.head * T * T, (state.head + 1) * T * T);
    const weight = (i, j) => (run.seen[i * T + j] ? weights()[i * T + j] : NaN); // NaN: masked
    const label = (k) => vocab[state.ids[k]];

    /* The sequence changed: the strip, the labels and the heatmap's geometry. */
    /* Elements are kept in pools and relabelled: a new sequence creates none it had before. */
    const tokenPool = [], colPool = [], rowPool = [];
    const pooled = (pool, k, create) => pool[k] || (pool[k] = create(k));
    function build() {
      T = state.ids.length;
      state.pinned = T - 1;
      state.query = state.key = null;
      tokens = state.ids.map((tokenId, k) => {
        const el = pooled(tokenPool, k, () => {
          const made = make("span", {
            class: "ax-token", tabindex: "-1", role: "button", "aria-pressed": "false",
            "data-index": String(k),
          });
          made.append(make("span", { class: "ax-text" }), make("span", { class: "ax-weight" }));
          return made;
        });
        setText(el.firstChild, shown(vocab[tokenId]));
        return el;
      });
      const unknown = state.unknown.map((piece) => make("span", {
        class: "ax-token ax-unknown", title: "not in the model's vocabulary: left out",
      }, shown(piece)));
      strip.replaceChildren(...tokens, ...unknown);
      const lab = () => make("div", { class: "ax-lab" });
      colLabels = state.ids.map((_, k) => pooled(colPool, k, lab));
      rowLabels = state.ids.map((_, k) => pooled(rowPool, k, lab));
      labelLayer.replaceChildren(...colLabels, ...rowLabels);
      splitIn.max = String(T);
      windowIn.max = String(T);
      root.dataset.tokens = state.ids.join(",");
      layout();
    }

    /* Cells and labels for the column's width: every token's text where a cell can be 12 px
       or more, else positions every few tokens. */
    const measure = document.createElement("canvas").getContext("2d");
    const widths = new Map(); // "px|text" -> its width: each label measured once
    const textWidth = (s, px) => {
      const key = `${px}|${s}`;
      if (!widths.has(key)) {
        measure.font = `${px}px ${fontFamily}`;
        widths.set(key, measure.measureText(s).width);
      }
      return widths.get(key);
    };
    // a vocabulary of single characters: a label is one character, which fits a smaller cell
    const narrow = vocab.every((s) => trimmed(s).length === 1);
    function layout() {
      // The geometry follows from the width alone (a label takes at most 6 em, one character
      // 2 em): the box keeps its size and place from one sequence to the next, and only the
      // labels' text changes.
      const N = Math.max(T, SIDE), gap = 4; // one box for every sequence up to SIDE tokens
      const em = narrow ? 2 : 6;
      let cell = Math.floor((columnWidth - em * 11 - gap - 2) / N);
      const words = cell >= (narrow ? 8 : 12);
      let font = 11, left;
      if (words) {
        cell = Math.min(22, cell);
        font = Math.min(12, Math.max(narrow ? 8 : 10, cell - (narrow ? 1 : 6)));
        left = em * font + gap;
      } else {
        left = textWidth(String(N - 1), font) + gap + 2;
        cell = Math.max(6, Math.floor((columnWidth - left - 2) / N));
      }
      const every = words ? 1 : Math.ceil((font + 3) / cell);
      const top = 14 + (words && !narrow ? 4.5 * font : font) + gap;
      const size = cell * T, box = cell * N;
      geometry = { cell, left, top, size, box };
      const key = [words, cell, font, left, top].join("|");
      const place = (el, css) => { // a label's style, set only when the geometry changed
        if (el.dataset.geometry !== key) {
          el.style.cssText = css;
          el.dataset.geometry = key;
        }
      };
      const fixed = "position: absolute; overflow: hidden; text-overflow: ellipsis; white-space: pre;";
      colLabels.forEach((el, k) => {
        setText(el, words ? trimmed(label(k)) : String(k));
        place(el, fixed + (words || k % every === 0 ? "" : "display: none;") + (words && !narrow
          ? `left: ${left + k * cell}px; width: ${cell}px; top: 14px; height: ${top - 14 - gap}px;` +
            "writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;"
          : words // one character, upright
            ? `left: ${left + k * cell}px; width: ${cell}px; top: 14px; height: ${font}px;` +
              "text-align: center; text-overflow: clip;"
            : `left: ${left + k * cell + cell / 2 - 12}px; width: 24px; top: ${top - gap - font}px;` +
              `height: ${font}px; text-align: center;`));
      });
      rowLabels.forEach((el, k) => {
        setText(el, words ? trimmed(label(k)) : String(k));
        place(el, fixed + (words || k % every === 0 ? "" : "display: none;") +
          `left: 0; width: ${left - gap}px; top: ${top + k * cell + cell / 2 - font / 2}px;` +
          `height: ${font}px; text-align: right;`);
      });
      Object.assign(plot.style, {
        width: `${Math.ceil(left + box + 2)}px`, height: `${Math.ceil(top + box + 2)}px`,
        fontSize: `${font}px`, lineHeight: "1",
      });
      const tall = words && !narrow; // the titles beside tall column labels, else above
      const clear = tall ? left : Math.max(left, 70); // beside "queries", not over it
      Object.assign(keysTitle.style, { left: `${clear}px`, top: "0px", fontSize: "11px" });
      Object.assign(queriesTitle.style, {
        left: "0px", top: tall ? `${top - 14}px` : "0px", fontSize: "11px", whiteSpace: "nowrap",
      });
      const dpr = window.devicePixelRatio || 1;
      for (const c of [cellsCanvas, canvas]) {
        if (c.width !== Math.round(box * dpr)) { // (clears it, and costs: only on change)
          c.width = c.height = Math.round(box * dpr);
        }
        Object.assign(c.style, {
          left: `${left}px`, top: `${top}px`, width: `${box}px`, height: `${box}px`,
        });
      }
      gridKey = "";
      plot.dataset.labels = words ? "tokens" : `positions every ${every}`;
    }

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
    let gridKey = ""; // what the hatch and grid were drawn for
    function draw() {
      const { cell, box } = geometry;
      const dpr = canvas.width / box;
      const ctx = cellsCanvas.getContext("2d");
      const { heatColour } = colours();
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, box, box);
      ctx.fillStyle = heatColour;
      const w = weights();
      for (let i = 0; i < T; i++) {
        for (let j = 0; j <= i; j++) {
          if (run.seen[i * T + j] && w[i * T + j] > 0.002) {
            ctx.globalAlpha = Math.min(1, w[i * T + j]);
            ctx.fillRect(j * cell, i * cell, cell, cell);
          }
        }
      }
      ctx.globalAlpha = 1;
      const key = `${state.ids.join(",")}|${state.mask}|${state.window}|${state.sinks}|` +
        `${state.split}|${canvas.width}|${palette && palette.line}`;
      if (key !== gridKey) drawGrid(key);
    }

    /* The masked cells' hatch and the grid lines, on the upper canvas. */
    function drawGrid(key) {
      gridKey = key;
      const { cell, size, box } = geometry;
      const dpr = canvas.width / box;
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, box, box);
      ctx.strokeStyle = colours().line;
      ctx.lineWidth = 1;
      ctx.beginPath();
      for (let i = 0; i < T; i++) {
        for (let j = 0; j < T; j++) {
          if (run.seen[i * T + j]) continue;
          const x = j * cell, y = i * cell;
          ctx.moveTo(x, y + cell / 2);
          ctx.lineTo(x + cell / 2, y);
          ctx.moveTo(x, y + cell);
          ctx.lineTo(x + cell, y);
        }
      }
      for (let k = 0; k <= T; k++) {
        ctx.moveTo(k * cell, 0);
        ctx.lineTo(k * cell, size);
        ctx.moveTo(0, k * cell);
        ctx.lineTo(size, k * cell);
      }
      ctx.stroke();
    }

    /* Every head's two scores on this sequence (of the model with the knocked-out heads). */
    function drawScores() {
      const text = (v) => (Number.isNaN(v) ? "\u2013" : v.toFixed(2));
      scoreCells.forEach(({ previous, induction }, k) => {
        const [l, h] = [Math.floor(k / H), k % H];
        const s = AM.headScores(run.weights[l].subarray(h * T * T, (h + 1) * T * T), state.ids);
        setText(previous, text(s.previous));
        setText(induction, text(s.induction));
      });
    }

    /* The next token after query i: top five, and with the knocked-out head if there is one. */
    /* Two top-five lists, made once and refilled: the intact model's, and (shown when heads
       are knocked out) the knocked-out model's; then where the token occurred before. */
    const lists = [0, 1].map(() => {
      const box = make("div", { class: "ax-top" });
      const title = make("p", { class: "ax-top-title" });
      const items = Array.from({ length: 5 }, () => {
        const li = make("li");
        li.append(make("span", { class: "ax-text" }), make("span"));
        return li;
      });
      const ol = make("ol");
      ol.append(...items);
      box.append(title, ol);
      return { box, title, items };
    });
    const copyNote = make("p", { class: "ax-top-note" });
    copyNote.hidden = !range; // where the token occurred before: for a model that copies
    prediction.append(lists[0].box, lists[1].box, copyNote);

    /* Where query i's token occurred before, what followed it, and whether the mask lets the
       query find it: the key after the copy must be visible to the query, and the copy to
       that key (a head of layer 0 writes into each token the token before it). */
    const copyWarning = make("strong");
    function drawCopies(i) {
      const copies = []; // the keys s that followed an earlier copy (token s - 1)
      for (let s = 1; s <= i; s++) if (state.ids[s - 1] === state.ids[i]) copies.push(s);
      if (!copies.length) {
        copyNote.replaceChildren(`${quoted(label(i))} has not occurred before: there is no copy ` +
          "to follow.");
        root.dataset.copies = "0,0";
        return;
      }
      const hidden = copies.filter((s) => !run.seen[i * T + s]);
      const cut = copies.filter((s) => run.seen[i * T + s] && !run.seen[s * T + s - 1]);
      const text = `Earlier, ${quoted(label(i))} was followed by ` +
        `${copies.map((s) => quoted(label(s))).join(", ")} (token ${copies.join(", ")}).`;
      const documents = state.mask === "documents";
      const why = [];
      if (hidden.length) {
        why.push(`The mask hides token ${hidden.join(", ")} from this query: ` + (documents
          ? "it is in the other document." : "it is outside the window."));
      }
      if (cut.length) {
        const copy = cut.map((s) => s - 1).join(", ");
        why.push(documents
          ? `The mask hides the earlier copy: token ${copy} is in the first document, and ` +
            `token ${cut.join(", ")}, in the second, cannot read what came before it.`
          : `A window of 1 hides the earlier copy (token ${copy}) from the token after it.`);
      }
      const blocked = hidden.length + cut.length;
      setText(copyWarning, blocked === copies.length ? "The mask hides every earlier copy " +
        "from this query, so no head can follow one. " : "");
      copyNote.replaceChildren(...(blocked === copies.length ? [copyWarning] : []),
        [text, ...why].join(" "));
      root.dataset.copies = `${copies.length},${blocked}`;
    }

    function drawPrediction(i) {
      const top = (out) => {
        const p = AM.probabilities(out.logitsAt(i));
        const best = Array.from(p.keys()).sort((a, b) => p[b] - p[a]).slice(0, 5);
        return { best, p };
      };
      const fill = ({ title, items }, text, { best, p }) => {
        // a flat distribution is no prediction: say so, or its top token reads like one
        setText(title, p[best[0]] < 0.1 ? `${text}: nothing (no token above 0.10)` : text);
        items.forEach((li, n) => {
          li.style.backgroundColor = heat(p[best[n]], 0.6);
          setText(li.firstChild, trimmed(vocab[best[n]]));
          setText(li.lastChild, p[best[n]].toFixed(2));
        });
      };
      const mine = top(intact);
      fill(lists[0], `After token ${i} ${quoted(label(i))}, the model predicts`, mine);
      lists[1].box.hidden = !state.ablate.length;
      let knocked = null;
      if (state.ablate.length) {
        knocked = top(run);
        const names = state.ablate.map(([l, h]) => `layer ${l}, head ${h}`).join("; ");
        fill(lists[1], `with ${names} knocked out`, knocked);
      }
      drawCopies(i);
      const first = mine.best[0];
      root.dataset.prediction = knocked ? `${first},${knocked.best[0]}` : String(first);
      root.dataset.probability = knocked ? `${mine.p[first]},${knocked.p[first]}` : String(mine.p[first]);
    }

    /* The sequence or a setting of the forward changed: run the model again (the intact
       model's run is kept while only the knocked-out heads change). */
    let intactKey = "";
    function compute() {
      const key = JSON.stringify([state.ids, state.mask, state.window, state.sinks, state.split,
        state.temperature]);
      if (key !== intactKey) {
        intact = AM.forward(model, state.ids, { ...state, ablate: [] });
        intactKey = key;
      }
      run = state.ablate.length ? AM.forward(model, state.ids, state) : intact;
      const t = state.temperature;
      setText(tempValue, `${t.toFixed(2)}`);
      temp.setAttribute("aria-valuetext", `temperature ${t.toFixed(2)}`);
      Object.assign(root.dataset, {
        mask: state.mask, temperature: t.toFixed(2), ablate: state.ablate.map((p) => p.join(",")).join(";"),
      });
      drawScores();
      update();
    }

    /* The shown layer or head changed (or the weights did): repaint, mark, read out. */
    function update() {
      draw();
      scoreCells.forEach(({ row }, k) => row.classList.toggle("ax-on", k === state.layer * H + state.head));
      plot.setAttribute("aria-label", `Attention weights of layer ${state.layer}, head ` +
        `${state.head} (${state.mask} mask, temperature ${state.temperature.toFixed(2)}): rows ` +
        "are queries, columns keys. The token strip above reads them out one query at a time.");
      Object.assign(root.dataset, { layer: String(state.layer), head: String(state.head) });
      focusRow();
    }

    function focusRow() {
      const i = state.query ?? state.pinned;
      let j = state.key;
      if (j === null) {
        j = 0;
        for (let k = 1; k <= i; k++) if (weight(i, k) > (weight(i, j) || -1)) j = k;
      }
      const { cell, left, top, size } = geometry;
      Object.assign(rowMark.style, { left: `${left}px`, top: `${top + i * cell}px`, width: `${size}px`, height: `${cell}px` });
      Object.assign(colMark.style, { left: `${left + j * cell}px`, top: `${top}px`, width: `${cell}px`, height: `${size}px` });
      for (const [list, cls, k] of [[rowLabels, "ax-on", i], [colLabels, "ax-on", j]]) {
        list.forEach((el, n) => el.classList.toggle(cls, n === k));
      }
      tokens.forEach((el, k) => {
        const w = weight(i, k);
        const masked = Number.isNaN(w);
        const text = masked ? "\u2013" : w.toFixed(2);
        el.classList.toggle("ax-query", k === i);
        el.classList.toggle("ax-key", k === j);
        el.classList.toggle("ax-masked", masked);
        el.setAttribute("aria-pressed", String(k === state.pinned));
        el.tabIndex = k === state.pinned ? 0 : -1; // one stop for the strip: arrows move in it
        el.style.backgroundColor = masked ? "" : heat(w, 0.6);
        setText(el.lastChild, text);
        el.setAttribute("aria-label", `token ${k} ${quoted(label(k))}` + (masked ? ", masked" : `, weight ${text}`));
      });
      const w = weight(i, j);
      setText(caption, `Layer ${state.layer}, head ${state.head}: query ${i} ${quoted(label(i))} ` +
        `\u2192 key ${j} ${quoted(label(j))}: ${Number.isNaN(w) ? "masked, weight 0" : w.toFixed(2)}` +
        (state.key === null ? " (its largest weight)" : ""));
      root.dataset.query = String(i);
      root.dataset.key = String(j);
      drawPrediction(i);
    }

    function choose(query, key) {
      if (query === state.query && key === state.key) return;
      state.query = query;
      state.key = key;
      focusRow();
    }
    function release() {
      const el = document.activeElement;
      choose(strip.contains(el) && el.dataset.index ? Number(el.dataset.index) : null, null);
    }

    /* A new sequence: from the text box, a preset, a picked token or the repeat button. */
    function setSequence(ids, unknown = [], fromText = false, typedIn = fromText) {
      const kept = ids.slice(0, maxT);
      state.ids = kept.length ? kept : state.ids;
      state.unknown = unknown;
      const notes = [];
      if (unknown.length) {
        notes.push(`Not in the model's vocabulary, left out: ${unknown.map(quoted).join(", ")}.`);
      }
      if (ids.length > maxT) { // the rule is said under the box: here, what it did
        notes.push(`Left out: the last ${ids.length - maxT} of the ${ids.length} tokens given.`);
      }
      const n = state.ids.length;
      const repeatable = range !== null && n >= range[0] && n <= range[1];
      repeat.disabled = !repeatable;
      if (range && !repeatable && typedIn) {
        notes.push(`Repeat takes ${range[0]} to ${range[1]} tokens, the repeats the model ` +
          `learned: ${n < range[0] ? "type more" : "this has " + n}.`);
      }
      if (!kept.length) notes.push("No token of the vocabulary in what you typed: the sequence is unchanged.");
      setText(notice, notes.join(" "));
      // a full sequence takes no token more: the control says so, and is off until one goes
      const full = n >= maxT;
      picker.disabled = full;
      setText(picker.options[0], full ? `full: ${n} of ${maxT} tokens` : ADD);
      if (!fromText) input.value = boxText(state.ids);
      state.split = Math.floor(state.ids.length / 2); // two documents: the halves (a repeat's)
      splitIn.value = String(state.split);
      build();
      compute();
      requestAnimationFrame(() => { // the pinned (last) token in view inside the strip
        const last = tokens[state.pinned];
        if (last) strip.scrollTop = last.offsetTop; // (the strip is positioned)
      });
    }

    // --- events -----------------------------------------------------------------------------
    input.addEventListener("input", () => {
      let text = untyped(input.value);
      if (words && !text.startsWith(" ") && !(JOIN && text.startsWith(JOIN))) text = " " + text;
      const pieces = (JOIN ? text.split(JOIN) : [text]).flatMap((part) => AM.tokenize(vocab, part));
      setSequence(pieces.filter((p) => p.id !== null).map((p) => p.id),
        pieces.filter((p) => p.id === null).map((p) => p.text), true);
    });
    preset.addEventListener("change", () => setSequence(data.presets[Number(preset.value)].ids));
    picker.addEventListener("change", () => {
      if (picker.value === "") return;
      setSequence([...state.ids, Number(picker.value)], state.unknown, false, true); // typed
      picker.value = "";
    });
    repeat.addEventListener("click", () => setSequence([...state.ids, ...state.ids], state.unknown));
    layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); update(); });
    headSel.addEventListener("change", () => { state.head = Number(headSel.value); update(); });
    const showNumbers = () => { // greyed out, not hidden: the controls never move
      windowIn.disabled = !["window", "sinks"].includes(state.mask);
      sinksIn.disabled = state.mask !== "sinks";
      splitIn.disabled = state.mask !== "documents";
    };
    maskSel.addEventListener("change", () => { state.mask = maskSel.value; showNumbers(); compute(); });
    const numbers = [[windowIn, "window", 1], [sinksIn, "sinks", 0], [splitIn, "split", 0]];
    for (const [el, key, min] of numbers) {
      el.addEventListener("input", () => {
        const v = Number.parseInt(el.value, 10);
        if (Number.isNaN(v) || v < min) return; // half-typed: keep the last good value
        state[key] = v;
        compute();
      });
      el.addEventListener("change", () => { el.value = String(state[key]); }); // what is used
    }
    temp.addEventListener("input", () => { state.temperature = 2 ** Number(temp.value); compute(); });
    scores.addEventListener("change", (event) => {
      if (event.target.type !== "checkbox") return;
      state.ablate = scoreCells.filter((c) => c.knock.checked)
        .map((c) => [Number(c.knock.dataset.layer), Number(c.knock.dataset.head)]);
      scoreCells.forEach((c) => c.row.classList.toggle("ax-off", c.knock.checked));
      compute();
    });
    scores.addEventListener("click", (event) => {
      const b = event.target.closest("button.ax-pick");
      if (!b) return;
      state.layer = Number(b.dataset.layer);
      state.head = Number(b.dataset.head);
      layerSel.value = b.dataset.layer;
      headSel.value = b.dataset.head;
      update();
    });
    canvas.addEventListener("pointermove", (event) => {
      const box = canvas.getBoundingClientRect();
      const N = Math.max(T, SIDE);
      const at = (v) => Math.floor((v / box.width) * N);
      const i = at(event.clientY - box.top), j = at(event.clientX - box.left);
      if (i >= 0 && j >= 0 && i < T && j < T) choose(i, j);
      else release();
    });
    canvas.addEventListener("pointerleave", release);
    const token = (event) => event.target.closest(".ax-token[data-index]");
    strip.addEventListener("pointerover", (event) => { if (token(event)) choose(Number(token(event).dataset.index), null); });
    strip.addEventListener("pointerleave", release);
    strip.addEventListener("focusin", (event) => { if (token(event)) choose(Number(token(event).dataset.index), null); });
    strip.addEventListener("focusout", (event) => { if (!strip.contains(event.relatedTarget)) choose(null, null); });
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
    new ResizeObserver((entries) => requestAnimationFrame(() => {
      const width = Math.floor(entries[entries.length - 1].contentRect.width);
      if (width === columnWidth || !run) return;
      columnWidth = width;
      layout();
      draw();
      focusRow();
    })).observe(scroll);
    new MutationObserver(() => {
      palette = null;
      if (run) draw();
    }).observe(document.body,
      { attributes: true, attributeFilter: ["data-md-color-scheme", "data-md-color-primary"] });

    windowIn.value = String(state.window);
    sinksIn.value = String(state.sinks);
    splitIn.value = String(state.split);
    maskSel.value = state.mask;
    layerSel.value = String(state.layer);
    headSel.value = String(state.head);
    showNumbers();
    setText(notice, "Loading the model\u2026");
    fetch(new URL(`../${data.model}`, scriptUrl))
      .then((response) => {
        if (!response.ok) throw new Error(`${response.status} ${response.url}`);
        return response.arrayBuffer();
      })
      .then((buffer) => {
        model = AM.load(data, buffer);
        columnWidth = scroll.clientWidth;
        setSequence(state.ids);
        root.dataset.loaded = "";
      })
      .catch((error) => {
        setText(notice, `The model did not load (${error.message}).`);
        throw error;
      });
  }

  function setupAll() {
    for (const root of document.querySelectorAll("[data-attention-explorer]:not([data-ready])")) {
      setup(root);
    }
  }

  if (typeof window.document$ !== "undefined" && window.document$.subscribe) {
    window.document$.subscribe(setupAll);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setupAll);
  } else {
    setupAll();
  }
})();
