"""The notebooks in notebooks/: each runs top to bottom in small mode and writes its figures.

Executed with nbclient on the ``python3`` kernel (the interpreter running pytest) with
TXF_NOTEBOOK_SMALL=1, TXF_NOTEBOOK_OUT set to a temporary folder and TXF_DATA unset (no real data);
the working directory is a temporary folder too, so nothing is written into the repository.
"""

import glob
import os
import pathlib
import re
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = os.path.join(ROOT, "notebooks")
CELL_TIMEOUT_S = 600  # per cell; small mode needs well under a minute per notebook on a quiet CPU
FIGURES = {
    "01_math": ["01_positional_encoding.png", "01_relative_position.png", "01_toy_attention.png",
                "01_masks.png"],
    "02_attention_maps": ["02_loss_curves.png", "02_encoder_self.png", "02_decoder_self.png",
                          "02_cross.png"],
    "03_ablations": ["03_loss_curves.png", "03_exact_match.png"],
    "04_embeddings": ["04_eigenvalues.png", "04_pca_words.png", "04_init_comparison.png"],
    "05_inside": ["05_cross_heads.png", "05_induction_attention.png", "05_induction_scores.png"],
}


def _notebooks():
  return sorted(os.path.basename(p)[:-6] for p in glob.glob(os.path.join(NOTEBOOK_DIR, "[0-9][0-9]_*.ipynb")))


def test_every_notebook_is_listed_here():
  assert _notebooks() == sorted(FIGURES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_in_small_mode_and_writes_its_figures(name, tmp_path, monkeypatch):
  executed = _executed_for_the_site(name)
  if executed:  # the site's build ran this notebook, as below, on the current sources: check that run
    with open(executed[0], encoding="utf-8") as f:
      _check(name, nbformat.read(f, as_version=4), pathlib.Path(executed[1]))
    return
  out = tmp_path / "figures"
  monkeypatch.setenv("TXF_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("TXF_NOTEBOOK_OUT", str(out))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("TMPDIR", str(tmp_path))          # the notebook's temporary folders, removed with it
  monkeypatch.delenv("TXF_DATA", raising=False)        # 04 then writes and reads its toy corpus
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  with open(os.path.join(NOTEBOOK_DIR, f"{name}.ipynb"), encoding="utf-8") as f:
    nb = nbformat.read(f, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError, naming the cell, on any error
  _check(name, nb, out)


def _executed_for_the_site(name):
  """(notebook, figures folder) executed by `mkdocs build` (docs/tools/execute_notebooks.py) in small
  mode, when its key (the notebook, txf's and the experiments' sources) is current; else None."""
  sys.path.insert(0, os.path.join(ROOT, "docs", "tools"))
  try:
    import execute_notebooks
  finally:
    sys.path.pop(0)
  return execute_notebooks.current(name)


def _check(name, nb, out):
  """No cell output is an error, and every figure the notebook draws is a non-empty PNG under out."""
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
  for figure in FIGURES[name]:
    path = out / figure
    assert path.is_file(), f"{name} did not write {figure} (wrote {sorted(os.listdir(out))})"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, f"{figure} is not a non-empty PNG"


def test_committed_notebooks_are_built_from_their_sources_without_outputs():
  """notebooks/NN_x.ipynb holds the cells of notebooks/src/NN_x.py as jupytext reads them (percent
  format), with no outputs: `jupytext --sync notebooks/src/*.py` was run after the last edit."""
  jupytext = pytest.importorskip("jupytext")
  for name in FIGURES:
    expected = jupytext.read(os.path.join(NOTEBOOK_DIR, "src", f"{name}.py"))
    with open(os.path.join(NOTEBOOK_DIR, f"{name}.ipynb"), encoding="utf-8") as f:
      committed = nbformat.read(f, as_version=4)
    assert [(c.cell_type, c.source) for c in committed.cells] == \
        [(c.cell_type, c.source) for c in expected.cells], \
        f"{name}.ipynb is stale: run `jupytext --sync notebooks/src/*.py`"
    for cell in committed.cells:
      if cell.cell_type == "code":
        assert cell.outputs == [] and cell.execution_count is None, f"{name}.ipynb has outputs: clear them"
    assert committed.metadata.get("kernelspec", {}).get("name") == "python3"


def test_notebook_sources_hold_no_computed_numbers_in_their_prose():
  """The Markdown of a notebook states what it computes, not a recorded result: no percentages or
  decimals in Markdown cells (those are formatted from the computed values in code cells)."""
  jupytext = pytest.importorskip("jupytext")
  for name in FIGURES:
    nb = jupytext.read(os.path.join(NOTEBOOK_DIR, "src", f"{name}.py"))
    for cell in nb.cells:
      if cell.cell_type == "markdown":
        prose = re.sub(r"`[^`]*`", "", cell.source)        # formulas and code spans may hold numbers
        found = re.findall(r"\b\d+(?:\.\d+)?%|\b0\.\d+\b", prose)
        assert not found, f"{name}: Markdown states {found}; format the computed value in a code cell"
