// MathJax 3, served from this site (assets/mathjax/, copied from a PyPI package at build time).
// Pages: pymdownx.arithmatex (generic) wraps math as \( \) and \[ \] in .arithmatex elements.
// Notebooks (mkdocs-jupyter): markdown cells keep $ $ and $$ $$ inside .jupyter-wrapper.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    // Typeset nothing but those elements (and, in notebooks, the paragraphs inside them).
    ignoreHtmlClass: "md-container",
    processHtmlClass: "arithmatex|jp-RenderedMarkdown",
  },
  chtml: { displayAlign: "center" },
};

// MathJax typesets each page once, when it loads. (No re-typesetting on Material's `document$`:
// without instant navigation it would only clear the glyph styles of the first pass.)
