"""The fused output head (``txf.kernels.head_cross_entropy``) under sharding, on 8 fake CPU devices.

The vocabulary (>= 1024 rows, padded) sharded on the tensor axis and the rows on data x fsdp, as a
mesh run lays them out: (4, 1, 2) and (1, 8, 1). Its loss terms and gradients must equal the
unfused head (logits, then ``label_smoothed_cross_entropy`` over the real vocabulary) computed in
numpy float64, and its compiled step must not gather the whole [V, d] table or the whole [N, V]
logits onto one device: the largest all-gathered array is checked in the optimised HLO and the
per-device temporaries are compared with the unfused head's.

The subprocess runs this file as a script with XLA_FLAGS set before jax is imported; it prints one
JSON line.
"""

import functools
import json
import os
import re
import subprocess
import sys

if __name__ == "__main__":  # the 8-device worker: XLA_FLAGS must be set before jax is imported
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax
import numpy as np

from txf import kernels, ops

N, D, V, V_PAD, EPS, CHUNK = 256, 32, 1100, 1152, 0.1, 64
MESHES = [(4, 1, 2), (1, 8, 1)]


def _inputs():
  rs = np.random.RandomState(0)
  h = rs.randn(N, D).astype(np.float32)
  table = (0.3 * rs.randn(V_PAD, D)).astype(np.float32)
  table[V:] = 50.0  # padding rows that would dominate every softmax if they were counted
  targets = rs.randint(3, V, size=(N,)).astype(np.int32)
  weights = (rs.rand(N) > 0.2).astype(np.float32)
  return h, table, targets, weights


def _reference_float64(h, table, targets, weights):
  """(loss_sum, nll_sum, correct, dL/dh, dL/dtable) of the unfused head over the real V, float64."""
  h, e = h.astype(np.float64), table[:V].astype(np.float64)
  z = h @ e.T
  zmax = z.max(-1, keepdims=True)
  lse = (zmax + np.log(np.exp(z - zmax).sum(-1, keepdims=True)))[:, 0]
  logp = z - lse[:, None]
  lp_y = logp[np.arange(N), targets]
  loss = -(1 - EPS) * lp_y - EPS / (V - 1) * (logp.sum(-1) - lp_y)
  p = np.exp(logp)
  q = np.full_like(p, EPS / (V - 1))
  q[np.arange(N), targets] = 1 - EPS
  g = weights[:, None] * (p - q)
  dtable = np.zeros_like(table, np.float64)
  dtable[:V] = g.T @ h
  correct = (np.argmax(z, -1) == targets) * weights
  return (float((loss * weights).sum()), float((-lp_y * weights).sum()),
          float(correct.sum()), g @ e, dtable)


def _largest_all_gather(hlo: str) -> int:
  """Elements of the largest array an all-gather produces in optimised HLO text."""
  best = 0
  for m in re.finditer(r"= \w+\[([\d,]*)\][^=\n]*? all-gather(?:-start)?\(", hlo):
    dims = [int(x) for x in m.group(1).split(",") if x]
    best = max(best, int(np.prod(dims)) if dims else 1)
  return best


def _worker() -> dict:
  assert jax.device_count() == 8, jax.devices()
  from jax.sharding import NamedSharding, PartitionSpec as P
  from txf.parallel import sharding

  h, table, targets, weights = _inputs()
  ref = _reference_float64(h, table, targets, weights)
  out = {}
  for shape in MESHES:
    mesh = sharding.make_mesh(shape)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    tab = NamedSharding(mesh, P("tensor", "fsdp"))

    def fused(h, table, targets, weights):
      def loss(h, table):
        terms = kernels.head_cross_entropy(h, table, targets, weights, EPS, CHUNK, V)
        return terms[0], terms[1:3]
      (value, (nll, correct)), (dh, dtable) = jax.value_and_grad(loss, (0, 1), has_aux=True)(
          h, table)
      return value, nll, correct, dh, dtable

    def unfused(h, table, targets, weights):
      def loss(h, table):
        logits = (h @ table.T)[:, :V]
        value, _ = ops.label_smoothed_cross_entropy(logits, targets, weights, EPS)
        return value
      value, (dh, dtable) = jax.value_and_grad(loss, (0, 1))(h, table)
      return value, dh, dtable

    args = (jax.device_put(h, rows), jax.device_put(table, tab), jax.device_put(targets, rows),
            jax.device_put(weights, rows))
    row = {}
    for name, fn in (("fused", fused), ("unfused", unfused)):
      # gradients laid out as their inputs, as a train step's out_shardings ask
      scalar = NamedSharding(mesh, P())
      outs = (scalar,) * (3 if name == "fused" else 1) + (rows, tab)
      with sharding.step_context(mesh, None):
        compiled = jax.jit(fn, out_shardings=outs).lower(*args).compile()
      hlo = compiled.as_text()
      mem = compiled.memory_analysis()
      row[name] = {"temp_bytes": int(mem.temp_size_in_bytes),
                   "largest_all_gather": _largest_all_gather(hlo)}
      result = jax.device_get(compiled(*args))
      if name == "fused":
        value, nll, correct, dh, dtable = result
        row["fused"].update(
            loss=float(value), nll=float(nll), correct=float(correct),
            dh_err=float(np.max(np.abs(dh - ref[3]))),
            dtable_err=float(np.max(np.abs(dtable - ref[4]))),
            dtable_padding_max=float(np.max(np.abs(dtable[V:]))),
            dtable_spec=str(compiled.output_shardings[4].spec))
      else:
        value, dh, dtable = result
        row["unfused"].update(loss=float(value), dh_err=float(np.max(np.abs(dh - ref[3]))),
                              dtable_err=float(np.max(np.abs(dtable - ref[4]))))
    out[str(shape)] = row
  return {"reference": ref[:3], "meshes": out}


@functools.lru_cache(maxsize=None)
def _result() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True,
                        text=True, timeout=600, env=env)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_fused_head_on_sharded_vocab_and_rows_equals_the_unfused_head():
  result = _result()
  loss, nll, correct = result["reference"]
  for shape, row in result["meshes"].items():
    fused, unfused = row["fused"], row["unfused"]
    np.testing.assert_allclose(fused["loss"], loss, rtol=1e-5, err_msg=shape)
    np.testing.assert_allclose(unfused["loss"], loss, rtol=1e-5, err_msg=shape)
    np.testing.assert_allclose(fused["nll"], nll, rtol=1e-5, err_msg=shape)
    assert fused["correct"] == correct, shape
    assert fused["dh_err"] < 1e-4 and fused["dtable_err"] < 1e-4, (shape, fused)
    assert fused["dtable_padding_max"] == 0.0, shape


def test_fused_head_under_sharding_gathers_neither_the_table_nor_the_logits():
  result = _result()
  for shape, row in result["meshes"].items():
    fused = row["fused"]
    # never the whole logits [N, V_pad]; the whole table [V_pad, d] only where FSDP splits its d
    # (then every use of a weight gathers it, the unfused head's too), and never all the rows
    # [N, d] (every device computes only its own rows' logits)
    assert fused["largest_all_gather"] < N * V_PAD, (shape, fused)
    if "(1, 8, 1)" != shape:
      assert fused["largest_all_gather"] < min(V_PAD * D, N * D), (shape, fused)
    else:
      assert fused["largest_all_gather"] <= row["unfused"]["largest_all_gather"], (shape, row)
    # and its temporaries stay below the unfused head's, which makes the [N, V] logits
    assert fused["temp_bytes"] < row["unfused"]["temp_bytes"], (shape, row)


if __name__ == "__main__":
  print(json.dumps(_worker()))
