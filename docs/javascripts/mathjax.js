// MathJax 3 (served from the site itself, assets/mathjax/) typesets only what pymdownx.arithmatex
// marks (\( ... \) inline, \[ ... \] display, class "arithmatex") and the notebooks' Markdown
// (cells and Markdown outputs: $ ... $, $$ ... $$, class "jp-RenderedMarkdown"); nothing else, so a
// "$" elsewhere on a page stays text. Inside those, code and pre are skipped (MathJax's default).
const TXF_MATH = ".arithmatex, .jp-RenderedMarkdown";
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"], ["$", "$"]], displayMath: [["\\[", "\\]"], ["$$", "$$"]], processEscapes: true,
        processEnvironments: true},
  startup: {elements: [TXF_MATH]},
};
// mkdocs-material swaps pages without a reload when navigation.instant is on: typeset each one.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache(); MathJax.typesetClear(); MathJax.texReset();
      MathJax.typesetPromise([...document.querySelectorAll(TXF_MATH)]);
    }
  });
}
