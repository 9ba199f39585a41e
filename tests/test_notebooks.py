"""The notebooks in notebooks/: each runs top to bottom in small mode and writes its figures.

Executed with nbclient on the ``python3`` kernel (the interpreter running pytest) with
TXF_NOTEBOOK_SMALL=1 and TXF_NOTEBOOK_OUT set to a temporary folder; the working directory is a
temporary folder too, so nothing is written into the repository.
"""

import glob
import os
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

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
}


def _notebooks():
  return sorted(os.path.basename(p)[:-6] for p in glob.glob(os.path.join(NOTEBOOK_DIR, "[0-9][0-9]_*.ipynb")))


def test_every_notebook_is_listed_here():
  assert _notebooks() == sorted(FIGURES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_notebook_runs_in_small_mode_and_writes_its_figures(name, tmp_path, monkeypatch):
  out = tmp_path / "figures"
  monkeypatch.setenv("TXF_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("TXF_NOTEBOOK_OUT", str(out))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
  with open(os.path.join(NOTEBOOK_DIR, f"{name}.ipynb"), encoding="utf-8") as f:
    nb = nbformat.read(f, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError, naming the cell, on any error
  errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]
  assert not errors
  for figure in FIGURES[name]:
    path = out / figure
    assert path.is_file(), f"{name} did not write {figure} (wrote {sorted(os.listdir(out))})"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, f"{figure} is not a non-empty PNG"


def test_committed_notebooks_are_built_from_their_sources_without_outputs():
  """notebooks/NN_x.ipynb == build_notebooks.py applied to notebooks/src/NN_x.py (outputs cleared)."""
  sys.path.insert(0, NOTEBOOK_DIR)
  try:
    import build_notebooks
  finally:
    sys.path.remove(NOTEBOOK_DIR)
  for name in FIGURES:
    with open(os.path.join(NOTEBOOK_DIR, "src", f"{name}.py"), encoding="utf-8") as f:
      expected = build_notebooks.build(build_notebooks.parse_percent(f.read()))
    with open(os.path.join(NOTEBOOK_DIR, f"{name}.ipynb"), encoding="utf-8") as f:
      committed = nbformat.read(f, as_version=4)
    assert [(c.cell_type, c.source) for c in committed.cells] == \
        [(c.cell_type, c.source) for c in expected.cells], f"{name}.ipynb is stale: run notebooks/build_notebooks.py"
    for cell in committed.cells:
      if cell.cell_type == "code":
        assert cell.outputs == [] and cell.execution_count is None, f"{name}.ipynb has outputs: clear them"


def test_percent_format_parsing():
  sys.path.insert(0, NOTEBOOK_DIR)
  try:
    from build_notebooks import parse_percent
  finally:
    sys.path.remove(NOTEBOOK_DIR)
  text = "# %% [markdown]\n# # Title\n# text\n\n# %%\nx = 1\n\n# %%\n\n# %%\nprint(x)\n"
  assert parse_percent(text) == [("markdown", "# Title\ntext"), ("code", "x = 1"), ("code", "print(x)")]


# ----------------------------------------------------------------------------- notebook helpers

def test_small_mode_and_pick(monkeypatch):
  from txf import notebook_utils as nu
  for value, small in [("1", True), ("true", True), ("0", False), ("", False)]:
    monkeypatch.setenv("TXF_NOTEBOOK_SMALL", value)
    assert nu.small_mode() is small and nu.pick("full", "small") == ("small" if small else "full")


def test_read_labelled_tsv_and_word_encoding(tmp_path):
  from txf import notebook_utils as nu
  path = tmp_path / "train.tsv"
  path.write_text("sentence\tlabel\na fine film\t1\na dull , dull film\t0\ntab\tinside\t1\n", encoding="utf-8")
  texts, labels = nu.read_labelled_tsv(str(path))
  assert texts == ["a fine film", "a dull , dull film", "tab\tinside"] and labels.tolist() == [1, 0, 1]
  vocab = nu.word_vocabulary(texts, 7)
  assert vocab[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
  assert vocab[4:] == ["a", "film", "dull"]  # by frequency (2, 2, 2), ties in first-seen order
  ids = nu.encode_words(["a dull film indeed", "film"], vocab, max_words=3)
  assert ids.tolist() == [[4, 6, 5, 2], [5, 2, 0, 0]]  # at most 3 words, then </s>, then <pad>
  assert nu.encode_words(["unseen film"], vocab, 3).tolist() == [[3, 5, 2, 0]]  # <unk> = 3


def test_sentiment_corpus_reads_real_data_or_falls_back(tmp_path):
  from txf import notebook_utils as nu
  folder = tmp_path / "rt-polarity"
  folder.mkdir()
  (folder / "train.tsv").write_text("good\t1\nbad\t0\n", encoding="utf-8")
  (folder / "dev.tsv").write_text("fine\t1\n", encoding="utf-8")
  real = nu.sentiment_corpus("rt-polarity", root=str(tmp_path))
  assert real.train_texts == ["good", "bad"] and real.dev_labels.tolist() == [1]
  assert real.note.startswith("real data")
  toy = nu.sentiment_corpus("missing", root=str(tmp_path), max_train=60, max_dev=20)
  assert toy.note.startswith("FALLBACK") and "missing" in toy.note
  assert len(toy.train_texts) == 60 and len(toy.dev_texts) == 20
  # label 1 = plural subject, so the toy English verb is the plural form ("see", not "sees")
  from txf.data.synthetic import VERBS
  plural_verbs = {pl for _, pl, _ in VERBS}
  for text, label in zip(toy.train_texts, toy.train_labels):
    assert label == any(w in plural_verbs for w in text.split())
  assert 0 < toy.train_labels.mean() < 1


def test_fixed_batches_pad_with_filler_rows():
  from txf import notebook_utils as nu
  ids = np.arange(1, 16, dtype=np.int32).reshape(5, 3)
  batches = nu.fixed_batches(ids, np.array([0, 1, 0, 1, 1], np.int32), 4)
  assert [b["inputs"].shape for b in batches] == [(4, 3), (4, 3)]
  assert (batches[1]["inputs"][1:] == 0).all() and batches[1]["label"].tolist() == [1, 0, 0, 0]
