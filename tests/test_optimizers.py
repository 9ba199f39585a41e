"""The optimizers beside Adam (optimizer.name: adafactor, lion, muon) and the schedules beside the
paper's (optimizer.schedule: rsqrt, cosine), each against a float64 numpy restatement of its
published update rule or a hand-worked value."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from txf.core import config as config_lib
from txf.models import init_params
from txf.nn import TransformerConfig
from txf.train import optimizer as opt

RNG = np.random.default_rng(0)


def _opt_cfg(**kw):
  c = config_lib.base_config().optimizer
  c.update(kw)
  return c


def _steps(tx, params, grads_list):
  """Apply ``tx`` for each gradient in turn; returns the parameters after each step (float64)."""
  state, out = tx.init(params), []
  for grads in grads_list:
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    out.append(jax.tree.map(lambda x: np.asarray(x, np.float64), params))
  return out


def test_rsqrt_schedule_hand_values():
  lr = opt.rsqrt_schedule(warmup_steps=100, scale=1.0)
  # steps 1 and 100: 1 / sqrt(100) = 0.1; step 400: 1 / 20 = 0.05 (optax counts from 0)
  np.testing.assert_allclose([float(lr(0)), float(lr(99)), float(lr(399))], [0.1, 0.1, 0.05], rtol=1e-6)


def test_cosine_schedule_hand_values():
  lr = opt.cosine_schedule(1e-3, warmup_steps=10, total_steps=110, final_fraction=0.1)
  # step 5: 5/10 of the peak; step 10: the peak; step 60 (half-way through the decay): f + (1 - f) / 2
  # = 0.55 of it; step 110 and after: the floor 0.1
  got = [float(lr(c - 1)) for c in (5, 10, 60, 110, 200)]
  np.testing.assert_allclose(got, [5e-4, 1e-3, 5.5e-4, 1e-4, 1e-4], rtol=1e-5)


def test_lion_two_steps_match_numpy():
  """u = sign(b1 m + (1 - b1) g); theta -= lr (u + lambda theta); m = b2 m + (1 - b2) g."""
  cfg = _opt_cfg(name="lion", schedule="constant", learning_rate=0.01, warmup_steps=1,
                 b1=0.9, b2=0.99, weight_decay=0.5)
  theta = RNG.normal(size=(3, 4))
  grads = [RNG.normal(size=(3, 4)) for _ in range(2)]
  got = _steps(opt.make_optimizer(cfg, d_model=16), {"w": jnp.asarray(theta, jnp.float32)},
               [{"w": jnp.asarray(g, jnp.float32)} for g in grads])
  m, want = np.zeros_like(theta), theta.copy()
  for step, g in enumerate(grads):
    u = np.sign(0.9 * m + 0.1 * g)
    want = want - 0.01 * (u + 0.5 * want)
    m = 0.99 * m + 0.01 * g
    np.testing.assert_allclose(got[step]["w"], want, rtol=1e-5, atol=1e-6)


def _adafactor_numpy(theta, grads, lr):
  """Adafactor's first steps in float64: factored second moments for a matrix with both sides
  >= 128, decay 1 - t^-0.8, update clipped to RMS 1, scaled by max(1e-3, RMS(theta))."""
  eps, out = 1e-30, []
  factored = theta.ndim == 2 and min(theta.shape) >= 128
  v = r = c = 0.0
  for t, g in enumerate(grads, start=1):
    decay = 1.0 - t ** -0.8
    sq = g * g + eps
    if factored:
      r = decay * r + (1 - decay) * sq.mean(axis=1)       # rows [n]
      c = decay * c + (1 - decay) * sq.mean(axis=0)       # columns [m]
      u = g / np.sqrt(np.outer(r / r.mean(), c))
    else:
      v = decay * v + (1 - decay) * sq
      u = g / np.sqrt(v)
    u = u / max(1.0, np.sqrt((u * u).mean()))
    theta = theta - lr * max(1e-3, np.sqrt((theta * theta).mean())) * u
    out.append(theta)
  return out


@pytest.mark.parametrize("shape", [(130, 128), (6,)])
def test_adafactor_two_steps_match_numpy(shape):
  cfg = _opt_cfg(name="adafactor", schedule="constant", learning_rate=0.01, warmup_steps=1)
  theta = RNG.normal(size=shape)
  grads = [RNG.normal(size=shape) * s for s in (1.0, 3.0)]
  got = _steps(opt.make_optimizer(cfg, d_model=16), {"w": jnp.asarray(theta, jnp.float32)},
               [{"w": jnp.asarray(g, jnp.float32)} for g in grads])
  for step, want in enumerate(_adafactor_numpy(theta, grads, 0.01)):
    np.testing.assert_allclose(got[step]["w"], want, rtol=1e-4, atol=1e-6)


def _newton_schulz(x, steps=5, coeffs=(3.4445, -4.775, 2.0315)):
  """The quintic Newton-Schulz iteration of Muon in float64: X <- a X + (b A + c A^2) X, A = X X^T,
  from X / ||X||_F, on the wide orientation."""
  a, b, c = coeffs
  tall = x.shape[0] > x.shape[1]
  x = x.T if tall else x
  x = x / (np.linalg.norm(x) + 1e-8)
  for _ in range(steps):
    s = x @ x.T
    x = a * x + (b * s + c * s @ s) @ x
  return x.T if tall else x


def test_muon_first_step_on_a_kernel_matches_numpy():
  """Step 1: m = g, Nesterov direction beta m + g = (1 + beta) g, orthogonalised by Newton-Schulz
  (the query kernel [d, h, d_k] as the matrix [d, h d_k]), scaled by sqrt(max(1, fan_out / fan_in)),
  times the rate; the embedding table goes to AdamW (its first step moves each entry by the
  rate times muon_adam_lr_ratio and by the Nesterov factor: its first moment, debiased at steps 2
  and 1, b1 (1 - b1) g / (1 - b1^2) + (1 - b1) g / (1 - b1) = (1 + b1 / (1 + b1)) g)."""
  cfg = _opt_cfg(name="muon", schedule="constant", learning_rate=0.02, warmup_steps=1,
                 momentum=0.95, muon_adam_lr_ratio=0.1, b1=0.9)
  d, h, dk, vocab = 8, 2, 8, 5
  params = {"query": RNG.normal(size=(d, h, dk)), "embedding": RNG.normal(size=(vocab, d))}
  grads = {k: RNG.normal(size=v.shape) for k, v in params.items()}
  got = _steps(opt.make_optimizer(cfg, d_model=d),
               jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params),
               [jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads)])[0]
  direction = _newton_schulz((1.95 * grads["query"]).reshape(d, h * dk))
  want = params["query"] - 0.02 * np.sqrt(max(1.0, h * dk / d)) * direction.reshape(d, h, dk)
  np.testing.assert_allclose(got["query"], want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got["embedding"], params["embedding"] - 0.002 * (1 + 0.9 / 1.9) * np.sign(grads["embedding"]),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_muon_takes_the_attention_and_ffn_matrices_of_a_model_and_leaves_the_rest_to_adam(scan):
  """Every attention kernel (query/key/value [.., d, h, d_k], out [.., h, d_v, d]) and FFN kernel
  (wi, wo) is a Muon matrix with its x W axes (a scanned stack's leading layer axis a batch axis);
  embeddings, norms and biases are not."""
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=11, d_model=8, num_heads=2, d_ff=16,
                          num_encoder_layers=2, num_decoder_layers=2, max_len=8, scan_layers=scan)
  example = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 4), jnp.int32)}
  shapes = jax.eval_shape(lambda rng: init_params(cfg, rng, example), jax.random.key(0))
  specs = jax.tree_util.tree_flatten_with_path(
      opt.muon_dimension_numbers(shapes), is_leaf=lambda x: x is None or hasattr(x, "reduction_axis"))[0]
  leaves = {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  seen = set()
  for path, spec in specs:
    key = jax.tree_util.keystr(path)
    name, ndim = key.rsplit("['", 1)[1][:-2], leaves[key].ndim
    if name in ("query", "key", "value"):
      assert (spec.reduction_axis, spec.output_axis) == ((ndim - 3,), (ndim - 2, ndim - 1)), key
    elif name == "out":
      assert (spec.reduction_axis, spec.output_axis) == ((ndim - 3, ndim - 2), (ndim - 1,)), key
    elif name in ("wi", "wo"):
      assert (spec.reduction_axis, spec.output_axis) == ((ndim - 2,), (ndim - 1,)), key
    else:
      assert spec is None, key
    seen.add(name)
  assert {"query", "key", "value", "out", "wi", "wo", "embedding", "scale", "bias"} <= seen
  assert (leaves[next(k for k in leaves if k.endswith("['wi']"))].ndim == 3) == scan


@pytest.mark.slow  # four trainings' compiles (~7 s); each optimizer's update is checked against numpy above
def test_each_optimizers_paper_settings_validate_and_train_a_step():
  """PAPER_SETTINGS: each optimizer with its paper's settings (the warmup shortened to 5 steps)
  is a valid config whose optimizer lowers the loss of a small least-squares problem in 20 steps."""
  assert set(opt.PAPER_SETTINGS) == set(opt.OPTIMIZERS.names())
  target = jnp.asarray(RNG.normal(size=(8, 8)), jnp.float32)
  loss = lambda p: jnp.mean((p["wi"] - target) ** 2) + jnp.mean(p["bias"] ** 2)
  for name, settings in opt.PAPER_SETTINGS.items():
    cfg = config_lib.base_config()
    cfg.optimizer.name = name
    cfg.optimizer.update(settings)
    cfg.optimizer.warmup_steps = min(settings.get("warmup_steps", 5), 5)
    cfg.num_train_steps = 20
    config_lib.validate(cfg)
    tx = opt.make_optimizer(cfg.optimizer, d_model=8, total_steps=20)
    params = {"wi": jnp.zeros((8, 8)), "bias": jnp.ones((8,))}
    state = tx.init(params)
    start = float(loss(params))
    for _ in range(20):
      updates, state = tx.update(jax.grad(loss)(params), state, params)
      params = optax.apply_updates(params, updates)
    assert float(loss(params)) < start, name


def test_the_tables_names_are_the_configs_allowed_values():
  assert config_lib.allowed_values("optimizer.name") == opt.OPTIMIZERS.names()
  assert config_lib.allowed_values("optimizer.schedule") == opt.SCHEDULES.names()
  # one list of choices: FIXED_CHOICES keeps only the fields no table or registry owns
  owned = set(config_lib._declared_choices) | set(config_lib._registries())  # pylint: disable=protected-access
  assert not owned & set(config_lib.FIXED_CHOICES), owned & set(config_lib.FIXED_CHOICES)
  cfg = config_lib.base_config()
  cfg.optimizer.name = "sgd"
  with pytest.raises(config_lib.ConfigError, match="optimizer.name='sgd' is not one of"):
    config_lib.validate(cfg)


@pytest.mark.parametrize("field,value,message", [
    ("momentum", 1.0, "optimizer.momentum=1.0 must be in"),
    ("muon_adam_lr_ratio", 0.0, "muon_adam_lr_ratio=0.0 must be > 0"),
    ("final_lr_fraction", 1.5, "final_lr_fraction=1.5 in"),
    ("schedule", "cosine", "warmup_steps=4000 must be < num_train_steps=1000")])
def test_validate_names_a_bad_optimizer_field(field, value, message):
  cfg = config_lib.base_config()
  cfg.optimizer[field] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(cfg)


@pytest.mark.parametrize("name", ["adafactor", "muon", "lion"])
def test_each_optimizers_state_shards_over_a_mesh(name):
  """Optimizer state leaves that follow a parameter take its mesh axes (Lion's and Muon's
  momentum, Adafactor's unfactored second moment); Adafactor's factored statistics, its (1,)
  placeholders and Muon's coefficient vector are replicated."""
  from txf.models import param_axes  # pylint: disable=import-outside-toplevel
  from txf.parallel import sharding  # pylint: disable=import-outside-toplevel
  cfg = TransformerConfig(family="encoder_decoder", vocab_size=64, d_model=128, num_heads=4,
                          d_ff=256, num_encoder_layers=1, num_decoder_layers=1, max_len=16)
  example = {"inputs": jnp.ones((1, 4), jnp.int32), "targets": jnp.ones((1, 4), jnp.int32)}
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), example))
  tx = opt.make_optimizer(_opt_cfg(name=name, schedule="constant", learning_rate=0.01), d_model=128)
  specs = sharding.partition_specs(jax.eval_shape(tx.init, params), param_axes(cfg, example), None,
                                   {"data": 1, "fsdp": 2, "tensor": 2})
  P = jax.sharding.PartitionSpec
  flat = {"/".join(sharding.path_parts(p)): s for p, s in jax.tree_util.tree_leaves_with_path(
      specs, is_leaf=lambda x: isinstance(x, P))}
  wi = [s for k, s in flat.items() if k.endswith("encoder/layer_0/ffn/wi")]
  bi = [s for k, s in flat.items() if k.endswith("encoder/layer_0/ffn/bi")]
  if name == "adafactor":  # wi [128, 256] is factored: v_row, v_col replicated; v (1,) too
    assert set(wi) == {P()} and P("tensor") in bi and P() in bi
  else:
    assert P("fsdp", "tensor") in wi
  if name == "muon":
    assert [s for k, s in flat.items() if k.endswith("ns_coeffs")] == [P()]
