"""The API reference's pages (docs/api/*.md): each opens with an introduction and a usage example,
then the reference generated from the docstrings. Every ```python block of a page runs here as
written, its blocks in order in one namespace, so an example cannot fall behind the code."""

import contextlib
import glob
import io
import os
import re

import pytest

from tests.conftest import ROOT

API = os.path.join(ROOT, "docs", "api")
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
# pages whose example trains (train.md) or reads that training's run back (inference.md): the
# end-to-end tier, run in this order in one folder
TRAINING = ("train", "inference")


def _pages():
  return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(API, "*.md")))


def _run_examples(name):
  """Execute the page's python blocks in order; what they print."""
  with open(os.path.join(API, f"{name}.md"), encoding="utf-8") as f:
    text = f.read()
  blocks = BLOCK.findall(text)
  assert blocks, f"docs/api/{name}.md shows no ```python example"
  namespace, out = {"__name__": f"docs_api_{name}"}, io.StringIO()
  with contextlib.redirect_stdout(out):
    for block in blocks:
      exec(compile(block, f"docs/api/{name}.md", "exec"), namespace)  # pylint: disable=exec-used
  return out.getvalue()


def test_every_api_page_introduces_its_package_before_the_reference():
  for name in _pages():
    with open(os.path.join(API, f"{name}.md"), encoding="utf-8") as f:
      text = f.read()
    intro = text.split(f"::: txf.{name}", 1)[0]
    assert f"::: txf.{name}" in text, name
    assert len(intro.splitlines()) > 20 and "```python" in intro, f"docs/api/{name}.md: no introduction"


@pytest.mark.parametrize("name", [n for n in _pages() if n not in TRAINING])
def test_api_page_example_runs(name):
  printed = _run_examples(name)
  assert printed.strip(), f"docs/api/{name}.md's example prints nothing"
  if name == "decode":  # the toy model's output, as the page's comments say
    assert "[5 5 5 2 0 0]" in printed
  if name == "analysis":
    assert printed.strip().endswith("True")
  if name == "parallel":
    assert "2.99999" in printed or "3.0" in printed, printed


@pytest.mark.slow
def test_api_train_and_inference_examples_run_in_order(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  trained = _run_examples("train")
  assert "exact_match" in trained and (tmp_path / "runs" / "api-example" / "config.json").is_file()
  served = _run_examples("inference")
  assert "encoder_decoder" in served, served
