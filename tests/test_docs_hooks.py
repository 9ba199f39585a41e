"""The documentation site's hooks (docs/tools/hooks.py) on their own, without building the site."""

import os
import re
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("mkdocs", reason="needs the docs extra: pip install -e '.[docs]'")
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
