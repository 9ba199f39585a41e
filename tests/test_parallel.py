"""Parallelism: the logical axes every parameter declares, mesh set-up, born-sharded init, distributed env parsing, and -- with 8
fake CPU devices in one subprocess -- pmap and mesh layouts (data=8; data=4 x tensor=2; fsdp=8;
data=2 x fsdp=2 x tensor=2 with gradient accumulation) reproducing the single-device step's
losses, parameters and eval sums over several steps, gradient accumulation equal to the large
batch step, and bf16 compute (float32 parameters) that trains.

The subprocess runs this file as a script (``python tests/test_parallel.py``) with XLA_FLAGS set
before jax is imported (8 devices; XLA backend optimisation off, which cuts compile time 2-3x on
CPU); it prints one JSON line, computed once per session and checked by several tests.
"""

import functools
import json
import os
import subprocess
import sys

WORKER_XLA_FLAGS = "--xla_force_host_platform_device_count=8"  # + tests/xla_flags.py's

if __name__ == "__main__":  # the 8-device worker: XLA_FLAGS must be set before jax is imported
  os.environ["XLA_FLAGS"] = WORKER_XLA_FLAGS
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from tests.xla_flags import TEST_XLA_FLAGS
  from txf.runtime.process import add_xla_flags
  add_xla_flags(*TEST_XLA_FLAGS)  # the flags of every test process (those this XLA knows)

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.models import init_params, param_axes
from txf.nn import TransformerConfig
from txf.parallel import ParallelSpec, distributed, make_runner, sharding
from txf.train.optimizer import OptimizerSpec, make_optimizer
from txf.train.steps import create_train_state, make_eval_step, make_train_step

BATCH, STEPS = 16, 3
LAYOUTS = [("pmap", None), ("mesh", (8, 1, 1)), ("mesh", (4, 1, 2)), ("mesh", (1, 8, 1))]


def _model(family="decoder_lm", **kw):
  base = dict(family=family, vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1,
              num_decoder_layers=1, dropout_rate=0.0, max_len=16, dtype="float32")
  base.update(kw)
  return TransformerConfig(**base)


def _batches(n=STEPS, rows=BATCH, seed=0):
  rs = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    y = rs.randint(3, 64, size=(rows, 8)).astype(np.int32)
    y[:, 5:] = 0  # padding is excluded from the loss
    x = rs.randint(3, 64, size=(rows, 8)).astype(np.int32)
    out.append({"inputs": x, "targets": y})
  return out


def _train(model_cfg, parallelism="single", mesh_shape=(-1, 1, 1), accum=1, batches=None,
           params=None, evaluate=False, rules=None):
  """(losses per step, host params, eval sums or None, runner, placed state); ``rules``: sharding
  rules over the defaults."""
  batches = batches or _batches()
  layout = ParallelSpec(parallelism=parallelism, mesh_shape=mesh_shape or (-1, 1, 1),
                        sharding_rules={**ParallelSpec().sharding_rules, **(rules or {})},
                        batch_size=BATCH, grad_accum_steps=accum)
  tx = make_optimizer(OptimizerSpec(warmup_steps=10), model_cfg.d_model)
  if params is None:
    params = jax.device_get(init_params(model_cfg, jax.random.key(0), batches[0]))
  runner = make_runner(layout, lambda ax: make_train_step(model_cfg, tx, 0.1, None, ax, accum),
                       lambda ax: make_eval_step(model_cfg, 0.1, ax), param_axes(model_cfg, batches[0]))
  state = runner.place_state(create_train_state(params, tx))
  losses = []
  for i, batch in enumerate(batches):
    state, metrics = runner.train_step(state, batch, jax.random.key(i))
    losses.append(float(metrics["loss"]))
  sums = jax.device_get(runner.eval_step(state, batches[0])) if evaluate else None
  return losses, runner.host_params(state), sums, runner, state


def _max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def _worker(part: str = "layouts") -> dict:
  """Runs with 8 devices: every layout against the single-device step, as JSON-able numbers
  (``part="grouped"``: grouped-query and multi-query attention on a tensor mesh only; ``"bf16"``:
  bfloat16 compute only, the quick tier's one test of this worker)."""
  assert jax.device_count() == 8, jax.devices()
  if part == "grouped":
    return {"grouped": _grouped()}
  if part == "bf16":
    return {"bf16": _bf16()}
  cfg = _model()
  ref_losses, ref_params, ref_sums, _, _ = _train(cfg, evaluate=True)
  out = {"reference": ref_losses, "layouts": {}}
  for parallelism, shape in LAYOUTS:
    losses, params, sums, runner, state = _train(cfg, parallelism, shape, evaluate=True)
    row = {"losses": losses, "param_diff": _max_diff(params, ref_params),
           "eval_diff": max(abs(float(sums[k]) - float(ref_sums[k])) / max(1.0, abs(float(ref_sums[k])))
                            for k in ref_sums)}
    if parallelism == "mesh":
      p = state.params["decoder"]["layer_0"]
      mu = state.opt_state[0].mu["decoder"]["layer_0"]
      spec = lambda x: [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
      row["specs"] = {"query": spec(p["self_attention"]["query"]), "wi": spec(p["ffn"]["wi"]),
                      "mu_wi": spec(mu["ffn"]["wi"]), "embedding": spec(state.params["embed"]["embedding"]),
                      "step": spec(state.step)}
      row["query_shard_shape"] = list(p["self_attention"]["query"].addressable_shards[0].data.shape)
    out["layouts"][f"{parallelism}{shape or ''}"] = row
  # a mixed layout with gradient accumulation: data=2 x fsdp=2 x tensor=2, 2 micro-batches
  losses, params, _, _, _ = _train(cfg, "mesh", (2, 2, 2), accum=2)
  out["layouts"]["mesh(2, 2, 2)+accum2"] = {"losses": losses, "param_diff": _max_diff(params, ref_params)}
  # gradient accumulation on one device: 2 micro-batches of 8 vs one batch of 16
  losses, params, _, _, _ = _train(cfg, "single", accum=2)
  out["accum"] = {"losses": losses, "param_diff": _max_diff(params, ref_params)}
  out["born_sharded"] = _born_sharded()
  out["constraints"] = _constraints(cfg)
  return out


def _grouped() -> dict:
  """Grouped-query (2 K/V heads of 4, split over tensor with the query heads) and multi-query
  attention (1 K/V head, replicated: sharding_rules.kv_heads='') with QK-norm on
  (data=4, tensor=2) against the one-device step."""
  out = {}
  for hk, rule in ((2, "tensor"), (1, "")):
    cfg = _model(family="encoder_decoder", num_kv_heads=hk, qk_norm="rms_norm")
    ref_losses, ref_params, _, _, _ = _train(cfg)
    losses, params, _, _, state = _train(cfg, "mesh", (4, 1, 2), rules={"kv_heads": rule})
    key = state.params["encoder"]["layer_0"]["self_attention"]["key"]
    out[str(hk)] = {"loss_diff": float(np.max(np.abs(np.array(losses) - np.array(ref_losses)))),
                    "param_diff": _max_diff(params, ref_params), "trains": ref_losses[-1] < ref_losses[0],
                    "key_spec": [list(a) if isinstance(a, tuple) else a for a in key.sharding.spec]}
  return out


def _born_sharded() -> dict:
  """The train state made in its shardings on (data=2, fsdp=2, tensor=2) vs the one-device init."""
  from txf.parallel import sharding as sh
  cfg = _model(family="encoder_decoder", share_embeddings=False, tie_output=False, target_vocab_size=48)
  batch = _batches(n=1)[0]
  tx = make_optimizer(OptimizerSpec(), cfg.d_model)
  init = lambda rng: create_train_state(init_params(cfg, rng, batch), tx)
  mesh = sh.make_mesh((2, 2, 2))
  state = sh.init_sharded(init, mesh, None, param_axes(cfg, batch), jax.random.key(3))
  reference = jax.device_get(init(jax.random.key(3)))
  gathered = jax.device_get(state)
  spec = lambda x: [list(a) if isinstance(a, tuple) else a for a in x.sharding.spec]
  specs = {"/".join(sh.path_parts(p)): spec(x) for p, x in jax.tree_util.tree_leaves_with_path(state)}
  shard_shapes = {"/".join(sh.path_parts(p)): list(x.addressable_shards[0].data.shape)
                  for p, x in jax.tree_util.tree_leaves_with_path(state)}
  equal = all(np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
              for a, b in zip(jax.tree_util.tree_leaves(gathered), jax.tree_util.tree_leaves(reference)))
  shapes = {"/".join(sh.path_parts(p)): list(np.shape(x))
            for p, x in jax.tree_util.tree_leaves_with_path(reference)}
  target = sh.abstract_sharded(jax.eval_shape(init, jax.random.key(0)), mesh, None, param_axes(cfg, batch))
  target_specs = {"/".join(sh.path_parts(p)): spec(x) for p, x in jax.tree_util.tree_leaves_with_path(target)}
  return {"specs": specs, "shard_shapes": shard_shapes, "shapes": shapes, "equal": bool(equal),
          "same_structure": jax.tree_util.tree_structure(gathered) == jax.tree_util.tree_structure(reference),
          "target_specs": target_specs}


def _constraints(cfg) -> dict:
  """Whether the traced step carries sharding constraints: on a mesh yes, on one device none."""
  layout = ParallelSpec(parallelism="mesh", mesh_shape=(2, 2, 2), batch_size=BATCH)
  tx = make_optimizer(OptimizerSpec(), cfg.d_model)
  batch = _batches(n=1)[0]
  params = init_params(cfg, jax.random.key(0), batch)
  steps = (lambda ax: make_train_step(cfg, tx, 0.1, None, ax), lambda ax: make_eval_step(cfg, 0.1, ax))
  runner = make_runner(layout, *steps, param_axes(cfg, batch))
  state = runner.place_state(create_train_state(params, tx))
  mesh_text = runner._train.lower(state, runner.local_batch(batch),
                                  runner._key_data(jax.random.key(0))).as_text()
  single = jax.jit(steps[0](None)).lower(create_train_state(params, tx), batch, jax.random.key(0)).as_text()
  return {"mesh": mesh_text.count("sharding_constraint"), "single": single.count("sharding_constraint")}


def _bf16() -> dict:
  """The translation model in bfloat16 compute from float32 parameters: logits, dtypes, training."""
  from txf.models import build_model
  batch = _batches(n=1)[0]
  f32, b16 = _model(family="encoder_decoder"), _model(family="encoder_decoder", dtype="bfloat16")
  params = jax.device_get(init_params(b16, jax.random.key(0), batch))
  logits = {cfg.dtype: jax.jit(build_model(cfg, deterministic=True).apply)(
      {"params": params}, batch["inputs"], batch["targets"]) for cfg in (f32, b16)}
  losses, new_params, _, _, _ = _train(b16, batches=[batch] * 12, params=params)
  dtypes = {str(x.dtype) for x in jax.tree_util.tree_leaves((params, new_params))}
  return {"param_dtypes": sorted(dtypes), "logits_dtype": str(logits["bfloat16"].dtype),
          "logits_scale": float(jnp.max(jnp.abs(logits["float32"]))),
          "logits_diff": float(jnp.max(jnp.abs(logits["bfloat16"] - logits["float32"]))),
          "losses": losses}


# -- the 8-device tests (one subprocess per session) -------------------------------------------------

@functools.lru_cache(maxsize=None)
def _worker_result(part: str = "layouts") -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), part], capture_output=True,
                        text=True, timeout=600, env=env)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_pmap_and_mesh_layouts_match_single_device_on_8_devices():
  result = _worker_result()
  ref = np.array(result["reference"])
  assert ref[-1] < ref[0]  # it trains
  assert set(result["layouts"]) == {"pmap", "mesh(8, 1, 1)", "mesh(4, 1, 2)", "mesh(1, 8, 1)",
                                    "mesh(2, 2, 2)+accum2"}
  for name, row in result["layouts"].items():
    np.testing.assert_allclose(row["losses"], ref, rtol=2e-6, atol=2e-6, err_msg=name)
    assert row["param_diff"] < 1e-5, (name, row["param_diff"])
    if "eval_diff" in row:
      assert row["eval_diff"] < 1e-5, (name, row["eval_diff"])


@pytest.mark.slow
def test_mesh_layouts_shard_params_and_optimizer_state_by_the_rules():
  result = _worker_result()
  fsdp = result["layouts"]["mesh(1, 8, 1)"]
  assert fsdp["specs"]["query"] == ["fsdp"]  # [d, h, d_k]: d over fsdp
  assert fsdp["specs"]["mu_wi"] == ["fsdp"]  # Adam moments shard like the params
  assert fsdp["query_shard_shape"] == [4, 4, 8]  # 32 / 8 rows per device
  tp = result["layouts"]["mesh(4, 1, 2)"]
  assert tp["specs"]["query"] == [None, "tensor"]  # heads over tensor
  assert tp["specs"]["wi"] == [None, "tensor"]     # d_ff over tensor
  assert tp["specs"]["embedding"] == ["tensor"]   # vocab over tensor
  assert tp["query_shard_shape"] == [32, 2, 8]
  assert result["layouts"]["mesh(8, 1, 1)"]["specs"]["query"] == []  # pure data parallel
  assert tp["specs"]["step"] == []


@pytest.mark.slow  # reads the 8-device worker's result, which the slow tier computes anyway
def test_state_is_born_sharded_and_equals_the_one_device_init():
  r = _worker_result()["born_sharded"]
  assert r["same_structure"] and r["equal"]  # gathered, bit for bit
  expected = {"query": ["fsdp", "tensor"], "out": ["tensor", None, "fsdp"], "wi": ["fsdp", "tensor"],
              "wo": ["tensor", "fsdp"], "bi": ["tensor"], "scale": [], "embedding": ["tensor", "fsdp"],
              "logits_kernel": ["fsdp", "tensor"]}
  checked = 0
  for path, spec in r["specs"].items():
    name = path.split("/")[-1]
    if path == "step" or path.endswith("count"):
      assert spec == [], path
    elif name in expected:
      assert spec == expected[name], (path, spec)
      checked += 1
    # each device holds its slice: every sharded dimension divided by 2
    shard, full = r["shard_shapes"][path], r["shapes"][path]
    ways = [1 if a is None else 2 ** (len(a) if isinstance(a, list) else 1) for a in spec]
    ways += [1] * (len(full) - len(ways))
    assert shard == [n // w for n, w in zip(full, ways)], (path, shard, full)
  assert checked > 30  # params, mu and nu of every weight
  assert r["target_specs"] == r["specs"]  # the restore target has the init's shardings


@pytest.mark.slow  # the 8-device worker's result, as above
def test_mesh_step_constrains_activations_and_the_one_device_step_does_not():
  r = _worker_result()["constraints"]
  assert r["single"] == 0 and r["mesh"] >= 5, r


@pytest.mark.slow  # a worker of its own: four trainings' compiles (~13 s) on 8 devices
def test_grouped_query_attention_on_a_tensor_mesh_matches_one_device():
  r = _worker_result("grouped")["grouped"]
  for hk, spec in (("2", [None, "tensor"]), ("1", [])):  # [d, h_kv, d_k]: K/V heads split or not
    assert r[hk]["trains"] and r[hk]["key_spec"] == spec, (hk, r[hk])
    assert r[hk]["loss_diff"] < 2e-6 and r[hk]["param_diff"] < 1e-5, (hk, r[hk])


# -- in-process tests (one device) -----------------------------------------------------------------

VARIANTS = [dict(family="encoder_decoder"), dict(family="decoder_lm", positional="learned"),
            dict(family="encoder_classifier", pre_ln=True, positional="learned"),
            dict(family="decoder_lm", tie_output=False, pre_ln=True),
            dict(family="encoder_decoder", share_embeddings=False, tie_output=False, pre_ln=True,
                 target_vocab_size=48),
            dict(family="encoder_decoder", num_kv_heads=2, qk_norm="layer_norm")]
EXAMPLE = {"inputs": np.ones((2, 8), np.int32), "targets": np.ones((2, 8), np.int32)}


def _abstract_params(**kw):
  cfg = _model(**kw)
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), EXAMPLE)), param_axes(cfg, EXAMPLE)


def _undeclared(params, axes):
  """Paths of parameters with no logical axes, or with a number of names other than their rank."""
  named = {sharding.path_parts(p): spec for p, spec in jax.tree_util.tree_leaves_with_path(
      axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))}
  bad = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    spec = named.get(sharding.path_parts(path))
    if spec is None or len(spec) != leaf.ndim or not all(isinstance(a, str) for a in spec):
      bad.append("/".join(sharding.path_parts(path)))
  return bad


def test_every_parameter_of_every_family_declares_its_logical_axes(monkeypatch):
  for kw in VARIANTS:
    params, axes = _abstract_params(**kw)
    assert len(jax.tree_util.tree_leaves(params)) > 10
    assert _undeclared(params, axes) == [], kw
  P = jax.sharding.PartitionSpec
  params, axes = _abstract_params(family="encoder_decoder", tie_output=False)
  layer = axes["encoder"]["layer_0"]
  assert layer["self_attention"]["query"] == P("embed", "heads", "kv")
  assert layer["self_attention"]["out"] == P("heads", "kv", "embed")
  assert layer["self_attention"]["key"] == P("embed", "heads", "kv")  # plain heads: as W^Q
  grouped = _abstract_params(family="encoder_decoder", num_kv_heads=2, qk_norm="rms_norm")[1]
  cross = grouped["decoder"]["layer_0"]["cross_attention"]
  assert cross["key"] == cross["value"] == P("embed", "kv_heads", "kv")
  assert cross["query_norm"]["scale"] == cross["key_norm"]["scale"] == P("kv")
  assert layer["ffn"]["wi"] == P("embed", "mlp") and layer["ffn"]["wo"] == P("mlp", "embed")
  assert axes["embed"]["embedding"] == P("vocab", "embed")
  assert axes["decoder"]["logits_kernel"] == P("embed", "vocab")
  # a parameter declared without axes is caught (W^O made with the bare initializer)
  from txf.nn import attention
  monkeypatch.setattr(attention, "OUT_INIT", attention.xavier)
  params, axes = _abstract_params(family="decoder_lm")
  assert _undeclared(params, axes) == ["decoder/layer_0/self_attention/out"]


def test_init_params_returns_plain_arrays_equal_to_the_boxed_values():
  from txf.models import init_boxed_params
  import flax.linen as nn
  cfg = _model(family="encoder_classifier")
  params = init_params(cfg, jax.random.key(1), EXAMPLE)
  boxed = init_boxed_params(cfg, jax.random.key(1), EXAMPLE)
  assert all(isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(params))
  assert all(isinstance(x, nn.LogicallyPartitioned)
             for x in jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)))
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(nn.unbox(boxed))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)  # jit vs op-by-op rounding


def test_partition_specs_follow_the_declared_axes_and_the_rules():
  from txf.core.config import ConfigError
  from txf.train.optimizer import make_optimizer as opt
  cfg = _model(family="encoder_decoder")
  params, axes = _abstract_params(family="encoder_decoder")
  state = jax.eval_shape(lambda: create_train_state(params, opt(OptimizerSpec(), 32)))
  sizes = {"data": 2, "fsdp": 2, "tensor": 2}
  specs = sharding.partition_specs(state, axes, None, sizes)
  P = jax.sharding.PartitionSpec
  attn = specs.params["encoder"]["layer_0"]["self_attention"]
  assert attn["query"] == P("fsdp", "tensor") and attn["out"] == P("tensor", None, "fsdp")
  assert specs.params["encoder"]["layer_0"]["ffn"]["wi"] == P("fsdp", "tensor")
  assert specs.params["encoder"]["layer_0"]["ffn"]["bi"] == P("tensor")
  assert specs.params["encoder"]["layer_0"]["norm_1"]["scale"] == P()
  assert specs.params["embed"]["embedding"] == P("tensor", "fsdp")
  # Adam's moments follow their parameters; the step and Adam's count are replicated
  assert specs.opt_state[0].mu["encoder"]["layer_0"]["ffn"]["wi"] == P("fsdp", "tensor")
  assert specs.opt_state[0].nu["embed"]["embedding"] == P("tensor", "fsdp")
  assert specs.step == P() and specs.opt_state[0].count == P()
  # rules from the config: replicate the embed axis, heads over fsdp x tensor
  rules, sizes4 = {"embed": "", "heads": "fsdp,tensor"}, {"data": 1, "fsdp": 2, "tensor": 2}
  specs = sharding.partition_specs(params, axes, rules, sizes4)
  assert specs["encoder"]["layer_0"]["self_attention"]["query"] == P(None, ("fsdp", "tensor"))
  # a mesh axis is used once per array: vocab and embed both on tensor -> embed replicated
  specs = sharding.partition_specs(params, axes, {"vocab": "tensor", "embed": "tensor"}, sizes)
  assert specs["decoder"]["layer_0"]["ffn"]["wi"] == P("tensor")
  # a leaf that follows no parameter is an error, not silently replicated
  try:
    sharding.partition_specs({"stray": np.zeros((4, 4))}, axes, None, sizes)
    raise AssertionError("a leaf without axes must raise")
  except ValueError as e:
    assert "stray" in str(e)
  # sharded axes that do not divide: vocab 37 over tensor=2, 2 heads over 4, d_ff 64 over 3
  for kw, rules, sizes_, words in [
      (dict(vocab_size=37), None, sizes, "'vocab' axis"),
      (dict(num_heads=2), {"heads": "fsdp,tensor"}, sizes4, "'heads' axis"),
      (dict(d_ff=64), None, {"data": 1, "fsdp": 1, "tensor": 3}, "'mlp' axis")]:
    p, a = _abstract_params(**kw)
    try:
      sharding.partition_specs(p, a, rules, sizes_)
      raise AssertionError(f"{kw} must raise")
    except ConfigError as e:
      assert words in str(e) and "mesh_shape" in str(e) and "sharding_rules." in str(e), str(e)
  try:
    sharding.parse_rules({"embed": "fdsp"})
    raise AssertionError("a misspelt mesh axis must raise")
  except ConfigError as e:
    assert "fdsp" in str(e) and "fsdp" in str(e)
  assert sharding.batch_spec(None, sizes) == P(("data", "fsdp"))
  assert sharding.batch_spec(None, {"data": 4, "fsdp": 1, "tensor": 2}) == P("data")
  del cfg


def test_mesh_shape_fills_one_axis_and_names_the_problem():
  assert sharding.resolve_mesh_shape((-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.resolve_mesh_shape((-1, 1, 2), 8) == (4, 1, 2)
  assert sharding.resolve_mesh_shape((1, 8, 1), 8) == (1, 8, 1)
  for bad, words in [((-1, -1, 1), "at most one -1"), ((3, 1, 1), "has 3 devices"),
                     ((-1, 3, 1), "not divisible"), ((8, 1), "needs 3 entries")]:
    try:
      sharding.resolve_mesh_shape(bad, 8)
      raise AssertionError(f"{bad} must raise")
    except ValueError as e:
      assert words in str(e), (bad, str(e))
  mesh = sharding.make_mesh((-1, 1, 1))
  assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.shape["data"] == jax.device_count()
  # one process: a dcn mesh of one slice is the plain mesh; two slices cannot be
  assert dict(sharding.make_mesh((-1, 1, 1), dcn_mesh_shape=(1, 1, 1)).shape)["data"] == jax.device_count()
  from txf.core.config import ConfigError
  try:
    sharding.make_mesh((-1, 1, 1), dcn_mesh_shape=(2, 1, 1))
    raise AssertionError("a dcn_mesh_shape over 2 processes must raise on 1")
  except ConfigError as e:
    assert "dcn_mesh_shape=(2, 1, 1)" in str(e) and "has 1" in str(e), str(e)


def test_memory_benchmark_divides_state_by_the_sharded_ways():
  from bench import memory
  rows = {r["layout"]: r for r in memory.memory_table(["base"], 8)}
  single = rows["single"]["total_mb"]
  assert 62e6 < rows["single"]["params"] < 66e6  # the paper's base model: 65M
  assert abs(rows["single"]["opt_mb"] - 2 * rows["single"]["params_mb"]) < 1e-3  # Adam: mu, nu
  assert rows["pmap x8"]["total_mb"] == rows["mesh data=8"]["total_mb"] == single  # replicas
  assert abs(rows["mesh fsdp=8"]["total_mb"] / single - 1 / 8) < 0.002  # only norms/biases whole
  assert abs(rows["mesh data=4 x tensor=2"]["total_mb"] / single - 1 / 2) < 0.002


def test_distributed_environment_parsing():
  assert distributed.distributed_args({}) is None
  assert distributed.distributed_args({"TXF_DISTRIBUTED": "off", "TXF_COORDINATOR": "h:1"}) is None
  args = distributed.distributed_args({"TXF_COORDINATOR": "127.0.0.1:1234", "TXF_NUM_PROCESSES": "2",
                                       "TXF_PROCESS_ID": "1", "TXF_HEARTBEAT_TIMEOUT": "7"})
  assert args == {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 1,
                  "heartbeat_timeout_seconds": 7, "initialization_timeout": 300,
                  "shutdown_timeout_seconds": 300}
  assert distributed.distributed_args({"TXF_DISTRIBUTED": "auto"})["heartbeat_timeout_seconds"] == distributed.HEARTBEAT_TIMEOUT == 30
  slurm = distributed.distributed_args({"SLURM_JOB_ID": "5", "SLURM_STEP_NUM_TASKS": "16",
                                        "TXF_LOCAL_DEVICE_IDS": "0,1,2,3"})
  assert "coordinator_address" not in slurm and slurm["local_device_ids"] == [0, 1, 2, 3]
  assert distributed.distributed_args({"SLURM_JOB_ID": "5", "SLURM_STEP_NUM_TASKS": "1"}) is None
  assert distributed.distributed_args({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "16"}) is None  # batch script
  try:
    distributed.distributed_args({"TXF_COORDINATOR": "h:1", "TXF_PROCESS_ID": "0"})
    raise AssertionError("an incomplete explicit set-up must raise")
  except ValueError as e:
    assert "TXF_NUM_PROCESSES" in str(e)


def test_runners_refuse_uneven_batches_with_the_fix_in_the_message():
  from txf.parallel.pmap_runner import PmapRunner
  from txf.parallel.runners import _check_batch
  runner = PmapRunner(lambda s, b, r: (s, {}), lambda p, b: {})
  runner.num_local = 4  # as on a 4-device host
  assert runner.split({"targets": np.zeros((8, 5))})["targets"].shape == (4, 2, 5)
  try:
    runner.split({"targets": np.zeros((10, 5))})
    raise AssertionError("an uneven pmap batch must raise")
  except ValueError as e:
    assert "batch_size a multiple of" in str(e)
  for args, words in [((12, 8, 1, "8 devices"), "multiple of 8"), ((16, 8, 4, "8 devices"), "multiple of 32")]:
    try:
      _check_batch(*args)
      raise AssertionError(f"{args} must raise")
    except ValueError as e:
      assert words in str(e)


@pytest.mark.slow  # two train steps of three shapes (30 s of compiles); the 8-device worker checks
def test_gradient_accumulation_equals_the_large_batch_step():  # accumulation on a mesh as well
  result = _worker_result()
  np.testing.assert_allclose(result["accum"]["losses"], result["reference"], rtol=2e-6, atol=2e-6)
  assert result["accum"]["param_diff"] < 1e-6


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_bfloat16_compute_keeps_float32_params_and_trains():
  r = _worker_result("bf16")["bf16"]
  assert r["param_dtypes"] == ["float32"]  # before and after training
  assert r["logits_dtype"] == "float32"    # the loss is computed in float32
  assert r["logits_diff"] < 0.05 * r["logits_scale"], r  # the same model, bf16 rounding only
  losses = r["losses"]
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.3, losses


if __name__ == "__main__":
  print(json.dumps(_worker(sys.argv[1] if len(sys.argv) > 1 else "layouts")))
