// MathJax 3 (served from the site itself, assets/mathjax/) typesets what pymdownx.arithmatex marks:
// \( ... \) inline and \[ ... \] display, in elements of class "arithmatex" only.
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true,
        processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"},
};
// mkdocs-material swaps pages without a reload when navigation.instant is on: typeset each one.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && MathJax.typesetPromise) {
      MathJax.startup.output.clearCache(); MathJax.typesetClear(); MathJax.texReset(); MathJax.typesetPromise();
    }
  });
}
