"""The documentation site, opened in a real browser: headless Chromium over the built site/.

Needs the site built first (`pip install -e '.[docs]' && mkdocs build --strict`, which .ci/run does)
and Debian's `chromium` driven by the `playwright` package with the system browser (no browser
download). Skips, saying which, when either is absent. The server is Python's http.server on
127.0.0.1; the browser runs with networking off beyond it, so a page that reached for a CDN would
show a console error here.
"""

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import ROOT
from txf.ops.feedforward import ACTIVATIONS

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

SITE = os.path.join(ROOT, "site")
CHROMIUM = next((p for p in (os.environ.get("TXF_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage"]
TIMEOUT_MS = 180_000  # generous: a loaded 2-core machine starts Chromium slowly
NOTEBOOK_FIGURES = {"01_math": 4, "02_attention_maps": 4, "03_ablations": 3, "04_embeddings": 3}

if not os.path.isfile(os.path.join(SITE, "index.html")):
  pytest.skip("no built site: run `pip install -e '.[docs]' && mkdocs build --strict` first",
              allow_module_level=True)
if CHROMIUM is None:
  pytest.skip("no chromium: `apt-get install chromium` (Debian)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[docs]' (playwright)")


def _pages():
  """URL paths of every page of the site ('/', '/api/ops/', ...)."""
  found = []
  for folder, _, names in os.walk(SITE):
    if "index.html" in names and not os.path.relpath(folder, SITE).startswith("assets"):
      rel = os.path.relpath(folder, SITE).replace(os.sep, "/")
      found.append("/" if rel == "." else f"/{rel}/")
  return sorted(found)


@pytest.fixture(scope="module")
def server():
  handler = functools.partial(_QuietHandler, directory=SITE)
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_address[1]}"
  httpd.shutdown()
  httpd.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@pytest.fixture(scope="module")
def browser():
  """One browser context of headless Chromium (pages opened in it share its cache)."""
  with sync_api.sync_playwright() as p:
    b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
    context = b.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    yield context
    context.close()
    b.close()


def _open(browser, url):
  """(page, console errors, failed requests) after loading url and letting its scripts settle."""
  page = browser.new_page()
  errors, failed = [], []
  page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
  page.on("pageerror", lambda e: errors.append(str(e)))
  page.on("requestfailed", lambda r: failed.append(r.url))
  page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
  page.goto(url, wait_until="load")
  page.wait_for_load_state("networkidle")
  return page, errors, failed


def _status(url):
  try:
    with urllib.request.urlopen(url, timeout=30) as r:
      return r.status
  except urllib.error.HTTPError as e:
    return e.code


def test_every_page_loads_clean_with_no_broken_link_or_image(server, browser):
  pages = _pages()
  assert {"/", "/formulas/", "/api/decode/", "/notebooks/01_math/"} <= set(pages), pages
  problems, checked = [], {}
  for path in pages:
    page, errors, failed = _open(browser, server + path)
    problems += [f"{path}: console: {e}" for e in errors] + [f"{path}: request: {f}" for f in failed]
    broken = page.evaluate("[...document.images].filter(i => !(i.complete && i.naturalWidth > 0))"
                           ".map(i => i.src)")
    problems += [f"{path}: broken image {src}" for src in broken]
    for href in page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)"):
      target = urllib.parse.urldefrag(href)[0]
      if target.startswith(server) and target not in checked:
        checked[target] = _status(target)
        if checked[target] != 200:
          problems.append(f"{path}: broken link {href} ({checked[target]})")
    page.close()
  assert not problems, "\n".join(problems)
  assert len(checked) >= len(pages)  # every page is linked from the navigation


def _typeset(browser, url, raw_test):
  """(page, console errors, counts) of a page's maths once MathJax has run: how many arithmatex
  elements, how many typeset, how many still hold raw TeX (``raw_test``: JS on their text ``t``)."""
  page, errors, _ = _open(browser, url)
  page.wait_for_function("document.querySelectorAll('.arithmatex mjx-container').length > 0", timeout=TIMEOUT_MS)
  counts = page.evaluate("""() => {
      const spans = [...document.querySelectorAll('.arithmatex')];
      return {spans: spans.length, typeset: spans.filter(s => s.querySelector('mjx-container')).length,
              raw: spans.filter(s => { const t = s.textContent; return %s; }).length}; }""" % raw_test)
  return page, errors, counts


def test_formulas_render_as_maths(server, browser):
  page, errors, counts = _typeset(browser, server + "/formulas/", r"/\\\(|\$/.test(t)")
  assert counts["spans"] >= 20, counts           # docs/formulas.md writes its formulas as $...$
  assert counts["typeset"] == counts["spans"] and counts["raw"] == 0, counts
  sqrt = page.evaluate("document.querySelectorAll('mjx-msqrt').length")
  assert sqrt >= 3, "no square root typeset (sqrt(d_model), sqrt(d_k), LayerNorm)"
  assert not errors


def test_docstring_formulas_render_as_maths_in_the_api_pages(server, browser):
  """The $$...$$ formulas of the ops docstrings (attention, multi-head, FFN, LayerNorm, PE, ...)."""
  page, errors, counts = _typeset(browser, server + "/api/ops/", "t.includes('$$')")
  assert counts["spans"] >= 8 and counts["typeset"] == counts["spans"] and counts["raw"] == 0, counts
  # softmax(QK^T / sqrt(d_k)), LayerNorm's sqrt(sigma^2 + eps), the embedding's sqrt(d_model)
  assert page.evaluate("document.querySelectorAll('mjx-msqrt').length") >= 3
  assert page.evaluate("document.querySelectorAll('mjx-mfrac').length") >= 3
  assert not errors


def test_notebook_formulas_render_as_maths(server, browser):
  """The $...$ and $$...$$ of a notebook's Markdown cells (01: PE, the rotation, attention, the
  Jacobians) typeset by MathJax, none left as raw TeX."""
  page, errors, _ = _open(browser, server + "/notebooks/01_math/")
  page.wait_for_function("document.querySelectorAll('.jp-RenderedMarkdown mjx-container').length > 0",
                         timeout=TIMEOUT_MS)
  typeset = page.evaluate("document.querySelectorAll('.jp-RenderedMarkdown mjx-container').length")
  # raw TeX left in the text (code spans, such as `$TXF_NOTEBOOK_OUT`, are not maths)
  raw = page.evaluate("""[...document.querySelectorAll('.jp-RenderedMarkdown')].filter(e => {
      const c = e.cloneNode(true); c.querySelectorAll('code, pre, mjx-container').forEach(x => x.remove());
      return /\\$|\\\\(sin|frac|omega)/.test(c.textContent); }).length""")
  assert typeset >= 15 and raw == 0, (typeset, raw)
  assert page.evaluate("document.querySelectorAll('.jp-RenderedMarkdown mjx-mfrac').length") >= 2
  assert not errors


@pytest.mark.parametrize("name", sorted(NOTEBOOK_FIGURES))
def test_notebook_page_shows_its_figures(server, browser, name):
  page, _, _ = _open(browser, server + f"/notebooks/{name}/")
  shown = page.evaluate("[...document.querySelectorAll('.jp-OutputArea-output img')]"
                        ".filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100).length")
  assert shown >= NOTEBOOK_FIGURES[name], f"{name}: {shown} figures shown (built with outputs?)"


@pytest.mark.parametrize("name", sorted(NOTEBOOK_FIGURES))
def test_notebook_page_has_a_download_link_and_no_machine_path(server, browser, name):
  page, errors, _ = _open(browser, server + f"/notebooks/{name}/")
  href = page.get_attribute(".txf-download a[download]", "href")
  url = urllib.parse.urljoin(server + f"/notebooks/{name}/", href)
  with urllib.request.urlopen(url, timeout=30) as r:  # the committed notebook: cells, no outputs
    nb = json.loads(r.read())
  assert nb["cells"] and all(not c.get("outputs") for c in nb["cells"]), url
  text = page.inner_text("article")
  assert "/tmp/" not in text and ROOT not in text, [l for l in text.splitlines() if "/tmp/" in l or ROOT in l]
  if name == "03_ablations":  # the site's copy runs in small mode: it says so, and shows the full
    # grid's stored results (when and on what CPU they were run) and a study run with txf sweep
    assert "Reduced run" in text and "The full grid, stored" in text and "A measured study" in text, \
        text[:2000]
  assert not errors


def test_api_objects_show_their_source_and_link_back_to_the_maths(server, browser):
  page, errors, _ = _open(browser, server + "/api/ops/")
  assert page.evaluate("document.querySelectorAll('details.mkdocstrings-source').length") >= 10  # "Source code in"
  assert "txf/ops/attention.py" in page.inner_text("article")
  links = page.eval_on_selector_all(".txf-maths a", "as => as.map(a => a.href)")
  assert len(links) >= 10, links
  maths, _, _ = _open(browser, links[0])
  anchor = urllib.parse.urlparse(links[0]).fragment
  assert anchor.startswith("formula-") and maths.evaluate(f"!!document.getElementById('{anchor}')"), links[0]
  assert not errors


def test_search_finds_beam_search(server, browser):
  page, _, _ = _open(browser, server + "/")
  page.click("label.md-search__icon, .md-search__input", timeout=TIMEOUT_MS)
  page.type(".md-search__input", "beam_search", delay=30)  # key by key, as a person types
  page.wait_for_selector(".md-search-result__item", timeout=TIMEOUT_MS)
  results = page.inner_text(".md-search-result__list")
  assert "beam_search" in results
  links = page.eval_on_selector_all(".md-search-result__item a", "as => as.map(a => a.href)")
  assert any("/api/decode/" in href for href in links), links


def test_the_configuration_reference_gives_each_fields_default_values_and_meaning(server, browser):
  page, errors, _ = _open(browser, server + "/config/")
  rows = page.evaluate("[...document.querySelectorAll('tr')].map(r => [...r.cells].map(c => c.innerText))")
  by_field = {r[0]: r[1:] for r in rows if len(r) == 4}
  assert by_field["optimizer.label_smoothing"][0] == "0.1"
  assert "epsilon_ls" in by_field["optimizer.label_smoothing"][2]
  assert by_field["model.activation"][1] == ", ".join(ACTIVATIONS.names())  # the table's names
  assert "decoder_lm" in by_field["model.family"][1]
  # the right-hand contents panel lists the page's sections
  toc = page.inner_text(".md-sidebar--secondary")
  assert all(s in toc for s in ("model", "optimizer", "data")), toc
  assert not errors


@pytest.mark.parametrize("path,heading", [("/huggingface/", "OPUS-MT / Hugging Face"),
                                          ("/extending/", "Extending txf"),
                                          ("/changelog/", "Unreleased")])
def test_the_hugging_face_extending_and_changelog_pages_are_in_the_site(server, browser, path, heading):
  page, errors, _ = _open(browser, server + path)
  assert heading in page.inner_text("article"), path
  nav = page.inner_text(".md-sidebar--primary")
  assert all(t in nav for t in ("Hugging Face", "Extending txf", "Configuration reference",
                                "Changelog")), nav
  assert not errors


def test_search_finds_what_a_config_field_means(server, browser):
  page, _, _ = _open(browser, server + "/")
  page.click("label.md-search__icon, .md-search__input", timeout=TIMEOUT_MS)
  page.type(".md-search__input", "label_smoothing", delay=30)
  page.wait_for_selector(".md-search-result__item", timeout=TIMEOUT_MS)
  links = page.eval_on_selector_all(".md-search-result__item a", "as => as.map(a => a.href)")
  assert any("/config/" in href for href in links), links


@pytest.mark.parametrize("path,sections", [("/", ["Quick start"]),
                                           ("/layout/", ["Layout", "Tests"]),
                                           ("/extending/", ["A model family", "An attention formula", "A Hugging Face architecture"])])
def test_the_contents_panel_lists_the_pages_sections(server, browser, path, sections):
  page, _, _ = _open(browser, server + path)
  toc = page.inner_text(".md-sidebar--secondary")
  assert all(s in toc for s in sections), (path, toc)
  assert page.evaluate("document.querySelectorAll('article h1').length") == 1, path


DEVELOPMENT_LOG = re.compile(r"issue \d|\bround\b|\bsitting\b|\bsession\b", re.I)


@pytest.mark.parametrize("path", ["/", "/benchmarks/", "/benchmarks-method/", "/known-numbers/", "/layout/"])
def test_pages_read_for_a_reader_not_as_a_development_log(server, browser, path):
  """Headings name topics, not issues, rounds or dated sittings (those are on the benchmark history
  page); the benchmarks page opens with the current figures, then what each optimisation bought and
  the limits."""
  page, _, _ = _open(browser, server + path)
  headings = page.eval_on_selector_all("article h1, article h2, article h3, article h4",
                                       "hs => hs.map(h => h.innerText)")
  assert headings and not [h for h in headings if DEVELOPMENT_LOG.search(h)], headings
  if path == "/benchmarks/":
    toc = page.inner_text(".md-sidebar--secondary")
    order = [toc.find(s) for s in ("Current figures", "What each optimisation bought", "The limits")]
    assert -1 not in order and order == sorted(order), toc
    history, _, _ = _open(browser, server + "/benchmarks-history/")
    assert "Benchmark history" in history.inner_text("article")


NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?(?:\s*±\s*\d+(?:\.\d+)?)?%?$")


class _Tables(html.parser.HTMLParser):
  """The tables of a page: each a list of rows, each row a list of its cells' text."""

  def __init__(self):
    super().__init__()
    self.tables, self.cell = [], None

  def handle_starttag(self, tag, attrs):
    if tag == "table":
      self.tables.append([])
    elif tag == "tr" and self.tables:
      self.tables[-1].append([])
    elif tag in ("td", "th") and self.tables and self.tables[-1]:
      self.cell = ""

  def handle_endtag(self, tag):
    if tag in ("td", "th") and self.cell is not None:
      self.tables[-1][-1].append(self.cell.strip())
      self.cell = None

  def handle_data(self, data):
    if self.cell is not None:
      self.cell += data


def zero_columns(rows):
  """The headers of the columns in which every cell is a number (at least 3) and every one is 0."""
  found = []
  for i, header in enumerate(rows[0] if rows else []):
    cells = [r[i] for r in rows[1:] if i < len(r)]
    if len(cells) >= 3 and all(NUMBER.match(c) for c in cells) and \
        not any(float(re.split(r"\s*±", c)[0].rstrip("%")) for c in cells):
      found.append(header)
  return found


def test_no_page_shows_a_table_column_whose_every_value_is_zero():
  """A column of results that are all zero (a smoke run's exact match, say) reads as a result;
  no page of the built site shows one."""
  offenders = []
  for path in _pages():
    parser = _Tables()
    with open(os.path.join(SITE, path.strip("/"), "index.html"), encoding="utf-8") as f:
      parser.feed(f.read())
    offenders += [f"{path}: column {c!r}" for rows in parser.tables for c in zero_columns(rows)]
  assert not offenders, "\n".join(offenders)
