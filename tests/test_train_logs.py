"""The one-line log, the log window's learning rate, the divergence guard and the loss plot's NLL,
each against hand-worked numbers."""

import numpy as np
import pytest

from txf.train import viz
from txf.train import logs
from txf.train.stopping import DivergenceError, DivergenceGuard


def test_log_line_is_the_issue_s_format():
  m = {"loss": 1.2149, "nll": 0.9812, "accuracy": 0.9071, "learning_rate": 0.0062,
       "tokens_per_second": 2812.4, "skipped": 0.0, "grad_norm": 0.5}
  assert logs.log_line(400, 1200, m, 70.2) == (
      "step 400/1200 | loss 1.21 | nll 0.98 | acc 0.91 | lr 6.2e-3 | 2,812 tok/s | eta 1m10s")
  big = {"loss": 3.7e9, "tokens_per_second": 10.0, "skipped": 2.0}
  assert logs.log_line(5, 10, big, None) == "step 5/10 | loss 3.7e+09 | 10 tok/s | 2 skipped"


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (9, "9s"), (70, "1m10s"), (3599, "59m59s"),
                                           (3725, "1h02m")])
def test_format_duration(seconds, text):
  assert logs.format_duration(seconds) == text


def test_eta_measures_from_the_first_logged_row(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(logs.time, "time", lambda: now[0])
  eta = logs.Eta(start_step=10)
  assert eta(10, 100) is None
  now[0] = 130.0  # 30 s for the first 10 steps (compilation included)
  assert eta(20, 100) == pytest.approx(3.0 * 80)
  now[0] = 140.0  # then 10 s for 10 steps: 1 s per step from the first row on
  assert eta(30, 100) == pytest.approx(1.0 * 70)


def test_window_row_means_metrics_but_takes_learning_rate_at_its_last_step():
  rows = [{"loss": np.float32(v), "learning_rate": np.float32(lr), "tokens": np.float32(10),
           "finite": np.float32(f)} for v, lr, f in [(4.0, 1e-3, 1), (np.nan, 2e-3, 0), (2.0, 3e-3, 1)]]
  m = logs.mean_metrics(rows)
  assert m["loss"] == pytest.approx(3.0)          # mean over the finite steps
  assert m["learning_rate"] == pytest.approx(3e-3)  # the last step's value, not 2e-3
  assert m["tokens"] == 30.0


def _guard(factor=10.0):
  return DivergenceGuard(factor, lambda: 40)


def _feed(guard, losses):
  for step, loss in enumerate(losses, 1):
    guard.push(step, {"loss": np.float32(loss)})
  guard.check()


def test_divergence_guard_stops_a_smoothed_loss_10x_over_its_minimum():
  # s_1 = 5; s_n = 0.9 s_{n-1} + 0.1 x: 1.0 for 40 steps brings s to ~1.06, then 1000 gives
  # s = 0.9 * s + 100 > 10 * min(s) and > s_1 = 5 at once.
  losses = [5.0] + [1.0] * 60
  s = [5.0]
  for x in losses[1:]:
    s.append(0.9 * s[-1] + 0.1 * x)
  guard = _guard()
  _feed(guard, losses)
  assert guard.best == (61, pytest.approx(min(s), rel=1e-6))
  with pytest.raises(DivergenceError) as e:
    guard.push(62, {"loss": np.float32(1000.0)})
    guard.check()
  expected = 0.9 * s[-1] + 100.0
  assert f"the loss diverged at step 62: the smoothed loss {expected:.4g} is over 10x" in str(e.value)
  assert "its last good checkpoint (step 40) is kept" in str(e.value)


def test_divergence_guard_lets_a_small_loss_wobble_and_can_be_off():
  # from 0.01, a rise to 2 (200x the minimum) stays below the starting loss 3: no stop
  _feed(_guard(), [3.0] + [0.01] * 50 + [2.0] * 50)
  _feed(_guard(), [3.0, np.nan, np.inf, 2.0])  # non-finite steps are the NonFiniteGuard's
  _feed(_guard(0.0), [1.0, 1.0, 1e9, 1e9])     # 0 = off
  with pytest.raises(DivergenceError):
    _feed(_guard(), [3.0, 3.0, 1e9])


def test_loss_plot_draws_the_nll_beside_the_loss(tmp_path, monkeypatch):
  drawn = {}
  monkeypatch.setattr(viz, "save_figure", lambda fig, path, tight=False: drawn.setdefault("fig", fig) and str(path))
  rows = [{"step": 10, "split": "train", "loss": 3.0, "nll": 2.5},
          {"step": 20, "split": "train", "loss": 2.0, "nll": 1.5},
          {"step": 20, "split": "eval", "loss": 2.2, "nll": 1.9}]
  viz.plot_loss_curves(rows, tmp_path / "l.png")
  lines = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()), ln.get_linestyle())
           for ln in drawn["fig"].axes[0].get_lines()}
  assert lines["train loss"] == ([10, 20], [3.0, 2.0], "-")
  assert lines["train nll"] == ([10, 20], [2.5, 1.5], "--")
  assert lines["eval nll"] == ([20], [1.9], "--")


def test_lm_prompts_are_the_starts_of_the_first_eval_rows_with_room_to_continue():
  from txf.train.samples import lm_prompts
  batches = [{"targets": np.array([[5, 6, 7, 8, 2, 0], [9, 2, 0, 0, 0, 0]])},
             {"targets": np.array([[4, 5, 6, 2, 0, 0], [0, 0, 0, 0, 0, 0]])}]
  # [9, 2] has one token before its EOS: too short; L shrinks to 3 - 1 = 2 so [4, 5, 6] continues
  np.testing.assert_array_equal(lm_prompts(batches, 5, length=16), [[5, 6], [4, 5]])
  np.testing.assert_array_equal(lm_prompts(batches, 1, length=2), [[5, 6]])
  assert lm_prompts([{"targets": np.zeros((2, 4), np.int32)}], 2).shape == (0, 0)
