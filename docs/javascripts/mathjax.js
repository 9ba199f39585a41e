// MathJax 3 (served from the site itself, assets/mathjax/) typesets what pymdownx.arithmatex marks
// (\( ... \) inline, \[ ... \] display, class "arithmatex") and the notebooks' Markdown cells
// ($ ... $, $$ ... $$, class "jp-RenderedMarkdown"); nothing else.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"], ["$", "$"]], displayMath: [["\\[", "\\]"], ["$$", "$$"]], processEscapes: true,
        processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex|jp-RenderedMarkdown"},
};
// mkdocs-material swaps pages without a reload when navigation.instant is on: typeset each one.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache(); MathJax.typesetClear(); MathJax.texReset(); MathJax.typesetPromise();
    }
  });
}
