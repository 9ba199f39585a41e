"""The documentation site's hooks (docs/tools/hooks.py) on their own, without building the site."""

import os
import re
import sys
import types

import pytest

from tests.conftest import ROOT

pytest.importorskip("mkdocs", reason="needs the docs extra: pip install -e '.[docs]'")
from mkdocs.exceptions import PluginError  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "docs", "tools"))
import hooks  # noqa: E402  (docs/tools/hooks.py)

sys.path.pop(0)


def _def_lines(relpath, name):
  """(first, last) line of `def name` in a file, read as text: the def line, to the line before the
  next top-level statement."""
  with open(os.path.join(ROOT, relpath), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = next(i for i, l in enumerate(lines) if re.match(rf"def {name}\(", l))
  end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()
              and not lines[i].startswith(")")), len(lines))
  while not lines[end - 1].strip():
    end -= 1
  return start + 1, end


def test_source_url_points_at_the_objects_lines_in_the_repository():
  first, last = _def_lines("txf/ops/attention.py", "causal_mask")
  url = hooks.source_url("txf.ops.attention.causal_mask", "https://example.org/txf/", "v1")
  assert url == f"https://example.org/txf/blob/v1/txf/ops/attention.py#L{first}-L{last}", url
  # a re-export names the module that defines the object
  assert hooks.source_url("txf.ops.causal_mask", "https://example.org/txf") == url.replace("/v1/", "/main/")
  assert hooks.source_url("txf.ops.attention.no_such_name", "https://example.org/txf") is None
  assert hooks.source_url("txf.ops.attention", "https://x.org/r") == "https://x.org/r/blob/main/txf/ops/attention.py"


def test_formula_rows_map_api_objects_to_the_maths_table():
  rows = hooks.formula_rows()
  with open(os.path.join(ROOT, "docs", "formulas.md"), encoding="utf-8") as f:
    row3 = next(l for l in f if l.startswith("| 3 |"))
  assert "txf/ops/attention.py::scaled_dot_product_attention" in row3
  assert "3" in rows["txf.ops.attention.scaled_dot_product_attention"]


def _page(src_uri):
  return types.SimpleNamespace(file=types.SimpleNamespace(src_uri=src_uri))


def test_the_config_directive_becomes_the_configuration_reference():
  out = hooks.on_page_markdown("# Configuration reference\n\n<!-- config: reference -->\n", _page("config.md"), {}, None)
  assert "<!--" not in out
  assert "## model" in out and "## optimizer" in out
  row = next(l for l in out.splitlines() if l.startswith("| `optimizer.label_smoothing` |"))
  assert "| `0.1` |" in row, row
  with pytest.raises(PluginError, match="unknown directive"):
    hooks.expand_directives("<!-- config: no_such_thing -->\n", "config.md")


def test_pages_are_their_own_source_no_text_is_copied_in():
  text = "# A page\n\n<!-- readme: Quick start -->\n\n<!-- file: BENCHMARKS.md -->\n"
  assert hooks.on_page_markdown(text, _page("index.md"), {}, None) == text
  docs = os.path.join(ROOT, "docs")
  pages = [os.path.join(d, n) for d, _, names in os.walk(docs) for n in names
           if n.endswith(".md") and "notebooks" not in os.path.relpath(d, docs).split(os.sep)]
  assert len(pages) >= 20, pages
  short = []
  for path in pages:
    with open(path, encoding="utf-8") as f:
      text = f.read()
    rel = os.path.relpath(path, docs)
    assert not re.search(r"<!-- (readme|file):", text), f"docs/{rel} copies text from another file"
    # an API page is its package's docstrings (mkdocstrings); the changelog page includes CHANGELOG.md
    if not rel.startswith("api" + os.sep) and rel != "changelog.md" and len(text.splitlines()) <= 20:
      short.append(rel)
  assert not short, f"pages of 20 lines or fewer: {short}"
  with open(os.path.join(docs, "changelog.md"), encoding="utf-8") as f:
    assert f.read().strip() == '--8<-- "CHANGELOG.md"'


def test_the_maths_page_links_its_functions_into_the_api_reference():
  row = "| 3 | attention | `txf/ops/attention.py::scaled_dot_product_attention`; `txf/core/objectives.py::span_counts` | t |"
  out = hooks.on_page_markdown(row + "\n", _page("formulas.md"), {}, None)
  assert out.startswith('| <a id="formula-3"></a>3 |'), out
  assert ("[`txf.ops.attention.scaled_dot_product_attention`]"
          "(api/ops.md#txf.ops.attention.scaled_dot_product_attention)") in out
  assert "`txf/core/objectives.py::span_counts`" in out  # no API page for it: left as written
  # other pages are left as they are
  assert hooks.on_page_markdown(row, _page("index.md"), {}, None) == row


def test_a_notebook_page_links_its_download():
  html = hooks.download_links("01_math", "notebooks/01_math")
  assert 'href="../download/01_math.ipynb" download' in html and "notebooks/src/01_math.py" in html
