"""Scaling-law fits with bootstrap intervals, in numpy (float64).

The laws, over model size N (parameters) and data D (training tokens):

  L(N)    = E + A N^-alpha
  L(D)    = E + B D^-beta
  L(N, D) = E + A N^-alpha + B D^-beta

Each is a sum of k power terms: L(x) = E + sum_j c_j x_j^-p_j. A fit minimises the squared error
over every (run, seed) point. For fixed exponents the law is linear in (E, c), so the exponents
start at the best point of a grid (E and c solved by least squares at each grid point, through a QR
factorisation of the design [1, x_1^-p_1, ...]), and Levenberg-Marquardt then refines the
exponents with (E, c) solved for at every step (variable projection). Every step is vectorised over many data sets y [M, n], so the bootstrap fits all its
draws at once.

The intervals are those of a residual bootstrap over seeds and runs: with the point fit's values
y_hat and residuals e_i = y_i - y_hat_i over all n points (every seed of every run), each draw
is y*_i = y_hat_i + s e_(u_i), u_i drawn uniformly from 1..n, s = sqrt(n / (n - p)) (p = 1 + 2k
parameters: the residuals of a fit are smaller than the noise by that much), and is fitted again;
an interval is the (5%, 95%) percentiles of a quantity over the draws (90%).

The compute-optimal allocation of the joint law: with compute C = 6 N D, minimising
L(N, C / 6N) over N gives

  N_opt(C) = G (C/6)^a,  D_opt(C) = G^-1 (C/6)^b,  a = beta / (alpha + beta),  b = alpha / (alpha + beta),
  G = (alpha A / (beta B))^(1 / (alpha + beta)).
"""

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

LEVEL = 0.90                    # the intervals' coverage
BOOTSTRAP_DRAWS = 1000          # the report's draws: the 5% / 95% percentiles from ~50 draws each side
GRID = np.linspace(0.02, 1.46, 25)  # the exponents' starting grid (step 0.06)
_CHUNK = 4096                   # data sets per grid pass (memory: grid x chunk x k floats)


def law(params: np.ndarray, x: np.ndarray) -> np.ndarray:
  """L for ``params`` [..., 1 + 2k] = (E, c_1, p_1, ..., c_k, p_k) at points ``x`` [n, k]
  (positive): E + sum_j c_j x_j^-p_j, shape [..., n]."""
  params = np.asarray(params, np.float64)
  k = x.shape[1]
  out = params[..., :1]
  for j in range(k):
    c, p = params[..., 1 + 2 * j, None], params[..., 2 + 2 * j, None]
    out = out + c * np.exp(-p * np.log(x[:, j]))
  return out


def _grid_start(logx: np.ndarray, y: np.ndarray, root_w: np.ndarray) -> np.ndarray:
  """The grid point of exponents [M, k] with the least weighted squared error of each data set
  in y [M, n] (weights root_w^2 [n]; E and c by least squares at each point)."""
  n, k = logx.shape
  grids = np.stack(np.meshgrid(*([GRID] * k), indexing="ij"), -1).reshape(-1, k)  # [G, k]
  design = np.concatenate([np.ones((len(grids), n, 1)),
                           np.exp(-grids[:, None, :] * logx[None, :, :])], -1)   # [G, n, 1+k]
  q, _ = np.linalg.qr(design * root_w[None, :, None])                            # [G, n, 1+k]
  basis = q.transpose(0, 2, 1).reshape(-1, n)                                    # [G (1+k), n]
  best = np.empty((y.shape[0], k))
  for lo in range(0, y.shape[0], _CHUNK):
    part = y[lo:lo + _CHUNK] * root_w                                            # [m, n]
    explained = ((basis @ part.T) ** 2).reshape(len(grids), 1 + k, -1).sum(1)    # [G, m]
    best[lo:lo + _CHUNK] = grids[np.argmax(explained, 0)]   # least error = most explained
  return best


def _linear_part(logx: np.ndarray, y: np.ndarray, exponents: np.ndarray, w: np.ndarray) -> np.ndarray:
  """(E, c_1..c_k) [M, 1+k] by weighted least squares for each data set's exponents [M, k]."""
  design = np.concatenate([np.ones(y.shape + (1,)),
                           np.exp(-exponents[:, None, :] * logx[None])], -1)     # [M, n, 1+k]
  gram = np.einsum("mni,mnj,n->mij", design, design, w) + 1e-12 * np.eye(design.shape[-1])
  return np.linalg.solve(gram, np.einsum("mni,mn,n->mi", design, y, w)[..., None])[..., 0]


def _assemble(linear: np.ndarray, exponents: np.ndarray) -> np.ndarray:
  """(E, c_1, p_1, ..., c_k, p_k) [M, 1 + 2k] from (E, c) [M, 1+k] and p [M, k]."""
  params = np.empty((linear.shape[0], 1 + 2 * exponents.shape[1]))
  params[:, 0] = linear[:, 0]
  params[:, 1::2] = linear[:, 1:]
  params[:, 2::2] = exponents
  return params


def fit(x: np.ndarray, y: np.ndarray, iterations: int = 60) -> np.ndarray:
  """Least-squares fits of E + sum_j c_j x_j^-p_j: points ``x`` [n, k] (positive), data sets
  ``y`` [M, n] (or [n]) -> params [M, 1 + 2k] (or [1 + 2k]) = (E, c_1, p_1, ..., c_k, p_k).

  Points at the same x (the seeds of one run) are replaced by their mean, weighted by their count
  (the same least-squares solution). Variable projection: (E, c) are solved by least squares for
  any exponents p, so the error is a function of p alone; p starts at the best grid point and
  Levenberg-Marquardt refines it (finite-difference Jacobian of the projected residuals, a damping
  lambda per data set, x10 on a step that does not lower the error, /10 on one that does)."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  single = y.ndim == 1
  y = y[None] if single else y
  x, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
  group = np.zeros((len(inverse), len(x)))
  group[np.arange(len(inverse)), inverse.reshape(-1)] = 1.0 / counts[inverse.reshape(-1)]
  y, w = y @ group, counts.astype(np.float64)
  root_w = np.sqrt(w)
  logx = np.log(x)
  k = x.shape[1]

  def residual(exponents):
    linear = _linear_part(logx, y, exponents, w)
    return linear, (law(_assemble(linear, exponents), x) - y) * root_w

  exponents = _grid_start(logx, y, root_w)
  linear, res = residual(exponents)
  error = (res ** 2).sum(-1)
  damping = np.full(y.shape[0], 1e-3)
  h = 1e-6
  for _ in range(iterations):
    jac = np.stack([(residual(exponents + h * np.eye(k)[j])[1] - res) / h for j in range(k)], -1)
    jtj = np.matmul(jac.transpose(0, 2, 1), jac)                                   # [M, k, k]
    grad = np.matmul(jac.transpose(0, 2, 1), res[..., None])[..., 0]
    diag = np.diagonal(jtj, axis1=1, axis2=2)
    lhs = jtj + damping[:, None, None] * (np.eye(k) * (diag[:, None, :] + 1e-12))
    trial = exponents + np.linalg.solve(lhs, -grad[..., None])[..., 0]
    trial_linear, trial_res = residual(trial)
    trial_err = (trial_res ** 2).sum(-1)
    better = np.isfinite(trial_err) & (trial_err < error)
    exponents = np.where(better[:, None], trial, exponents)
    linear = np.where(better[:, None], trial_linear, linear)
    res = np.where(better[:, None], trial_res, res)
    improvement = np.where(better, error - trial_err, 0.0)
    error = np.where(better, trial_err, error)
    damping = np.clip(np.where(better, damping / 10, damping * 10), 1e-12, 1e12)
    if np.all(improvement <= 1e-14 * (error + 1e-30)) and np.all(damping >= 1e2):
      break  # no data set moves any more
  params = _assemble(linear, exponents)
  return params[0] if single else params


@dataclasses.dataclass
class Fit:
  """A law fitted with its bootstrap: ``params`` (E, c_1, p_1, ...) of the point fit, ``draws``
  [B, 1 + 2k] of the bootstrap, ``x`` [n, k] and ``y`` [n] the points fitted, ``names`` of x's
  columns ("N", "D")."""
  params: np.ndarray
  draws: np.ndarray
  x: np.ndarray
  y: np.ndarray
  names: Tuple[str, ...]

  def interval(self, values: np.ndarray, level: float = LEVEL) -> Tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 percentiles of ``values`` [B] over the draws."""
    lo, hi = np.nanpercentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)

  def parameter_table(self) -> Dict[str, Tuple[float, float, float]]:
    """{name: (point, low, high)}: E, and A, alpha for N, B, beta for D."""
    names = ["E"]
    for col in self.names:
      names += ["A", "alpha"] if col == "N" else ["B", "beta"]
    return {name: (float(self.params[i]),) + self.interval(self.draws[:, i])
            for i, name in enumerate(names)}

  def predict(self, point: Sequence[float]) -> Tuple[float, float, float]:
    """(L at ``point`` [k] from the point fit, and its interval over the draws)."""
    at = np.asarray(point, np.float64)[None, :]
    return (float(law(self.params, at)[0]),) + self.interval(law(self.draws, at)[:, 0])

  def predict_runs(self, point: Sequence[float], runs: int, seed: int = 0) -> Tuple[float, float, float]:
    """(L at ``point`` [k], and the interval of the mean of ``runs`` new runs there): each draw's
    law at the point plus the mean of ``runs`` residuals of the point fit drawn with replacement
    (inflated by sqrt(n / (n - p)), as the bootstrap's), so the interval holds the new runs' own
    seed noise and the law's misfit besides the uncertainty of its parameters."""
    at = np.asarray(point, np.float64)[None, :]
    n, p = len(self.y), len(self.params)
    residuals = (self.y - law(self.params, self.x)) * np.sqrt(n / max(n - p, 1))
    picks = np.random.default_rng(seed).integers(0, n, size=(len(self.draws), runs))
    values = law(self.draws, at)[:, 0] + residuals[picks].mean(1)
    return (float(law(self.params, at)[0]),) + self.interval(values)


def bootstrap_fit(x: np.ndarray, y: np.ndarray, names: Sequence[str], draws: int = BOOTSTRAP_DRAWS,
                  seed: int = 0) -> Fit:
  """The point fit of ``y`` [n] at ``x`` [n, k] and ``draws`` residual-bootstrap refits (module
  doc), from ``np.random.default_rng(seed)``."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return bootstrap_many(x, y[None], draws, np.random.default_rng(seed), names)[0]


def bootstrap_many(x: np.ndarray, ys: np.ndarray, draws: int, rng: np.random.Generator,
                   names: Sequence[str] = ("N", "D")) -> list:
  """``bootstrap_fit`` of every data set in ``ys`` [R, n] at the same points, all draws fitted
  together (the synthetic checks fit hundreds of data sets at once)."""
  n, k = x.shape
  points = fit(x, ys)                                                   # [R, p]
  fitted = law(points, x)                                               # [R, n]
  inflate = np.sqrt(n / max(n - (1 + 2 * k), 1))
  residuals = (ys - fitted) * inflate
  picks = rng.integers(0, n, size=(ys.shape[0], draws, n))
  boot = fitted[:, None, :] + np.take_along_axis(residuals[:, None, :].repeat(draws, 1), picks, -1)
  refits = fit(x, boot.reshape(-1, n)).reshape(ys.shape[0], draws, -1)
  return [Fit(points[r], refits[r], x, ys[r], tuple(names)) for r in range(ys.shape[0])]


def compute_optimal(params: np.ndarray, compute: float) -> Dict[str, np.ndarray]:
  """The joint law's allocation of ``compute`` C = 6 N D (module doc) for ``params`` [..., 5] =
  (E, A, alpha, B, beta): {"a", "b", "N", "D", "L"} arrays [...]."""
  params = np.asarray(params, np.float64)
  e, a_coef, alpha, b_coef, beta = (params[..., i] for i in range(5))
  with np.errstate(all="ignore"):
    a, b = beta / (alpha + beta), alpha / (alpha + beta)
    g = (alpha * a_coef / (beta * b_coef)) ** (1.0 / (alpha + beta))
    n_opt = g * (compute / 6.0) ** a
    d_opt = (compute / 6.0) / n_opt
    loss = e + a_coef * n_opt ** -alpha + b_coef * d_opt ** -beta
  return {"a": a, "b": b, "N": n_opt, "D": d_opt, "L": loss}


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> Optional[Tuple[float, float]]:
  """(low, high) percentiles of the finite ``values``, or None when there are none."""
  values = np.asarray(values, np.float64)
  values = values[np.isfinite(values)]
  if not values.size:
    return None
  lo, hi = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
  return float(lo), float(hi)
