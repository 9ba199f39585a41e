"""The noise floor of a sweep: per-arm mean, sample standard deviation and Student-t interval, and
Welch's t-test of each arm against the baseline. numpy in float64; the t distribution's quantile
and tail come from scipy.stats (installed with jax).

For the values x_1..x_n of one arm (one per seed):

  mean  m = (1/n) sum_i x_i
  std   s = sqrt( sum_i (x_i - m)^2 / (n - 1) )                      (sample, ddof = 1)
  95% CI  m -/+ t_{0.975, n-1} * s / sqrt(n)                          (Student t, n - 1 dof)

For arm a against the baseline b (Welch: the variances are not assumed equal):

  diff  d = m_a - m_b,   se = sqrt( s_a^2 / n_a + s_b^2 / n_b )
  t     = d / se
  dof   nu = se^4 / ( (s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1) )   (Welch-Satterthwaite)
  p     = 2 * P(T_nu > |t|)                                           (two-sided)
  95% CI of d:  d -/+ t_{0.975, nu} * se
"""

import dataclasses
import math
from typing import Sequence

import numpy as np

from txf.core.errors import TxfError

try:
  from scipy import stats as scipy_stats
except ImportError:  # pragma: no cover - scipy comes with jax
  scipy_stats = None

CONFIDENCE = 0.95


def _t():
  """scipy.stats.t, or a TxfError saying how to get it."""
  if scipy_stats is None:
    raise TxfError("the sweep statistics need scipy (the t distribution's quantiles): "
                   "pip install scipy")
  return scipy_stats.t


def t_quantile(q: float, dof: float) -> float:
  """The q-quantile of Student's t with ``dof`` degrees of freedom (NaN when dof is not > 0)."""
  if not dof > 0:
    return math.nan
  return float(_t().ppf(q, dof))


def t_two_sided_p(t: float, dof: float) -> float:
  """p = 2 P(T_dof > |t|); NaN when t or dof is undefined."""
  if math.isnan(t) or not dof > 0:
    return math.nan
  return float(2.0 * _t().sf(abs(t), dof))


@dataclasses.dataclass
class Summary:
  """One arm's values: n, mean, sample std (ddof=1) and the 95% Student-t interval of the mean
  (NaN where n is too small: std and interval need n >= 2, the mean n >= 1)."""
  n: int
  mean: float
  std: float
  ci_low: float
  ci_high: float


def summarize(values: Sequence[float], confidence: float = CONFIDENCE) -> Summary:
  """Summary of ``values`` [n]: m, s and m -/+ t_{(1+c)/2, n-1} s / sqrt(n)."""
  x = np.asarray(values, dtype=np.float64)
  n = int(x.size)
  if n == 0:
    return Summary(0, math.nan, math.nan, math.nan, math.nan)
  mean = float(x.sum() / n)
  if n < 2:
    return Summary(n, mean, math.nan, math.nan, math.nan)
  std = float(np.sqrt(((x - mean) ** 2).sum() / (n - 1)))
  half = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
  return Summary(n, mean, std, mean - half, mean + half)


@dataclasses.dataclass
class Welch:
  """Welch's t-test of arm a against arm b: the difference of the means a - b, its standard error,
  t, the Welch-Satterthwaite degrees of freedom, the two-sided p-value and the 95% interval of
  the difference (NaN where either arm has fewer than 2 values)."""
  diff: float
  se: float
  t: float
  dof: float
  p: float
  ci_low: float
  ci_high: float


def welch(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Welch:
  """Welch's unequal-variance t-test of ``a`` [n_a] against ``b`` [n_b] (formulas: module doc).
  With both variances 0 the test is undefined: t = +-inf and p = 0 if the means differ, else NaN."""
  sa, sb = summarize(a), summarize(b)
  diff = sa.mean - sb.mean
  if sa.n < 2 or sb.n < 2:
    return Welch(diff, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
  va, vb = sa.std ** 2 / sa.n, sb.std ** 2 / sb.n
  se = math.sqrt(va + vb)
  if se == 0:
    t = math.copysign(math.inf, diff) if diff else math.nan
    return Welch(diff, 0.0, t, math.nan, 0.0 if diff else math.nan, diff, diff)
  dof = (va + vb) ** 2 / (va ** 2 / (sa.n - 1) + vb ** 2 / (sb.n - 1))
  t = diff / se
  half = t_quantile(0.5 + confidence / 2, dof) * se
  return Welch(diff, se, t, dof, t_two_sided_p(t, dof), diff - half, diff + half)
