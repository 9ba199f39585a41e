"""txf.viz: every plot is written as a real, non-blank PNG."""

import json

import matplotlib.image
import numpy as np
import pytest

from txf import viz
from txf.ops import positional

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png_with_content(path):
  with open(path, "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  image = matplotlib.image.imread(path)
  assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
  rgba = np.round(image.reshape(-1, image.shape[-1]) * 255).astype(np.uint32)
  packed = sum(rgba[:, c] << (8 * c) for c in range(rgba.shape[1]))  # one integer per colour
  assert len(np.unique(packed)) > 2  # more than a blank background and one line colour


def metrics_rows():
  rows = []
  for step in range(1, 41):
    lr = 512 ** -0.5 * min(step ** -0.5, step * 10 ** -1.5)
    rows.append({"step": step, "split": "train", "loss": 5.0 / step ** 0.3, "learning_rate": lr,
                 "accuracy": 0.02 * step})
    if step % 10 == 0:
      rows.append({"step": step, "split": "eval", "loss": 5.5 / step ** 0.3, "accuracy": 0.015 * step})
  return rows


def test_attention_heads_from_array_and_from_list(tmp_path):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 4, 5))
  weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)  # [layers, heads, L_q, L_k]
  queries, keys = ["the", "cat", "sat", "</s>"], ["die", "Katze", "sass", ".", "</s>"]
  path = viz.plot_attention_heads(weights, queries, keys, "cross-attention", tmp_path / "a.png")
  assert path == str(tmp_path / "a.png")
  assert_png_with_content(path)
  path = viz.plot_attention_heads([w for w in weights], queries, keys, "as a list", tmp_path / "b.png")
  assert_png_with_content(path)
  with pytest.raises(ValueError):
    viz.plot_attention_heads(weights, queries[:2], keys, "wrong labels", tmp_path / "c.png")


def test_positional_encoding_heatmap(tmp_path):
  path = viz.plot_positional_encoding(positional.sinusoidal_positional_encoding(32, 16),
                                      tmp_path / "sub" / "pe.png")
  assert_png_with_content(path)


def test_learning_rate_from_function_and_from_points(tmp_path):
  schedule = lambda step: 512 ** -0.5 * np.minimum(np.maximum(step, 1) ** -0.5,  # noqa: E731
                                                   np.maximum(step, 1) * 100 ** -1.5)
  assert_png_with_content(viz.plot_learning_rate(schedule, tmp_path / "fn.png", num_steps=500))
  scalar_only = lambda step: float(schedule(int(step)))  # noqa: E731  (rejects arrays)
  assert_png_with_content(viz.plot_learning_rate(scalar_only, tmp_path / "scalar.png", num_steps=50))
  steps = np.arange(1, 30)
  assert_png_with_content(viz.plot_learning_rate((steps, schedule(steps)), tmp_path / "pts.png"))


def test_loss_curves_from_rows_and_from_jsonl(tmp_path):
  rows = metrics_rows()
  assert_png_with_content(viz.plot_loss_curves(rows, tmp_path / "rows.png"))
  jsonl = tmp_path / "metrics.jsonl"
  jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
  assert_png_with_content(viz.plot_loss_curves(jsonl, tmp_path / "file.png"))
  with pytest.raises(ValueError):
    viz.plot_loss_curves([{"step": 1, "split": "train", "accuracy": 0.5}], tmp_path / "none.png")


def test_write_run_plots(tmp_path):
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_rows()))
  written = viz.write_run_plots(tmp_path)
  assert sorted(written) == sorted([str(tmp_path / "loss_curves.png"), str(tmp_path / "learning_rate.png")])
  for path in written:
    assert_png_with_content(path)
  steps, values = viz._series(metrics_rows(), "learning_rate")
  assert steps.tolist() == list(range(1, 41)) and values.max() == pytest.approx(512 ** -0.5 * 10 ** -0.5)


def test_write_run_plots_skips_what_was_not_logged(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 5, "split": "eval", "loss": 2.0}) + "\n")
  assert viz.write_run_plots(tmp_path) == [str(tmp_path / "loss_curves.png")]
