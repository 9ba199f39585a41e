"""txf.train.viz: every plot is written as a real, non-blank PNG."""

import json

import matplotlib.image
import numpy as np
import pytest

from txf.train import viz
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


def test_logit_lens_and_head_table(tmp_path):
  rng = np.random.default_rng(1)
  lens = rng.normal(size=(3, 4, 7))  # [layers + 1, L, V]
  path = viz.plot_logit_lens(lens, ["<s>", "a", "b", "c"], lambda i: f"t{i}", tmp_path / "l.png")
  assert_png_with_content(path)
  with pytest.raises(ValueError):
    viz.plot_logit_lens(lens, ["<s>", "a"], str, tmp_path / "bad.png")
  path = viz.plot_head_table(rng.normal(size=(2, 4)), ["decoder/layer_0/x", "decoder/layer_1/x"],
                             "loss change", tmp_path / "h.png")
  assert_png_with_content(path)
  with pytest.raises(ValueError):
    viz.plot_head_table(np.zeros((2, 4)), ["one label"], "wrong labels", tmp_path / "bad2.png")


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


def test_attention_maps_of_layer_0_match_numpy_float64():
  """viz.attention_maps on an encoder classifier: layer 0's maps equal softmax(q k^T / sqrt(d_k))
  computed in float64 from the embeddings + PE (post-LN: layer 0 attends over them directly), with
  weight 0 on padded keys; a later layer is there too, rows summing to 1."""
  import jax
  from txf.models import init_params
  from txf.nn import TransformerConfig
  cfg = TransformerConfig(family="encoder_classifier", vocab_size=11, num_classes=2, d_model=8,
                          num_heads=2, d_ff=16, num_encoder_layers=2, num_decoder_layers=0, max_len=8)
  ids = np.array([[5, 7, 9, 2, 0, 0], [4, 2, 0, 0, 0, 0]], np.int32)     # 0 = <pad>
  params = init_params(cfg, jax.random.key(0), {"inputs": ids})
  maps = viz.attention_maps(cfg, params, {"inputs": ids})
  assert sorted(maps) == ["encoder_self"] and maps["encoder_self"].shape == (2, 2, 2, 6, 6)

  table = np.asarray(params["embed"]["embedding"], np.float64)
  x = table[ids] * np.sqrt(8) + np.asarray(positional.sinusoidal_positional_encoding(6, 8), np.float64)
  att = params["encoder"]["layer_0"]["self_attention"]
  q = np.einsum("bld,dhk->bhlk", x, np.asarray(att["query"], np.float64))
  k = np.einsum("bld,dhk->bhlk", x, np.asarray(att["key"], np.float64))
  scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(4)                       # [B, h, L, L]
  real = ids != 0
  scores = np.where(real[:, None, None, :], scores, -np.inf)
  expected = np.exp(scores - scores.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  got = maps["encoder_self"][0]
  for b in range(2):                      # rows of real queries (padded query rows are masked out)
    n = real[b].sum()
    np.testing.assert_allclose(got[b, :, :n], expected[b, :, :n], atol=1e-5)
    assert (got[b, :, :n, n:] == 0).all()
  np.testing.assert_allclose(maps["encoder_self"][1, 0, :, :4].sum(-1), 1.0, atol=1e-5)
