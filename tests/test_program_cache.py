"""The program cache (txf/runtime/program_cache.py, keyed by txf/runtime/fingerprint.py): what its key sees,
that a kept program is read back whole in a new process (nothing traced, the same bits, the
state still donated), that a program jax's own cache handed back is not kept, and that an
unreadable entry is one warning line."""

import dataclasses
import functools
import glob
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT
from txf.runtime import compile_cache, fingerprint, program_cache


# --------------------------------------------------------------------------- the fingerprint

def _scaled(factor):
  return lambda x: x * factor


@dataclasses.dataclass(frozen=True)
class _Cfg:
  width: int
  rate: float


def test_the_fingerprint_follows_what_a_closure_holds():
  fp = fingerprint.closure_fingerprint
  assert fp(_scaled(2.0)) == fp(_scaled(2.0))
  assert fp(_scaled(2.0)) != fp(_scaled(3.0))  # a closed-over number
  assert fp(_scaled(np.ones(3))) != fp(_scaled(np.array([1.0, 1.0, 2.0])))  # an array's values
  assert fp(_scaled(np.ones(3, np.float32))) != fp(_scaled(np.ones(3, np.float64)))  # its dtype
  assert fp(_Cfg(4, 0.1)) == fp(_Cfg(4, 0.1)) and fp(_Cfg(4, 0.1)) != fp(_Cfg(4, 0.2))
  assert fp(functools.partial(_scaled, 2)) != fp(functools.partial(_scaled, 3))
  assert fp(lambda x: x + 1) != fp(lambda x: x + 2)  # the code's constants
  assert fp(lambda x: x + 1) != fp(lambda x: x - 1)  # the code itself
  assert fp({"a": [1, (2, "b")]}) == fp({"a": [1, (2, "b")]}) != fp({"a": [1, (2, "c")]})
  assert fp(jax.random.key(1)) != fp(jax.random.key(2))  # a typed PRNG key by its bits
  cyclic = []
  cyclic.append(cyclic)
  assert fp(cyclic) == fp(cyclic)


def test_what_the_fingerprint_cannot_describe_is_refused():
  class Opaque:
    __slots__ = ()

  with pytest.raises(fingerprint.Unfingerprintable):
    fingerprint.closure_fingerprint(_scaled(Opaque()))


def test_txf_s_train_step_and_init_are_described():
  """The train step's closure (the model, the optimizer, the schedule, the loss) and the init's
  static config: a cache that refused them would keep nothing."""
  from bench import train as train_bench  # pylint: disable=import-outside-toplevel
  cfg = dataclasses.replace(train_bench.config_for("small"), num_encoder_layers=1, num_decoder_layers=1,
                            d_model=32, num_heads=2,
                            d_ff=64, vocab_size=64)
  batch = train_bench.random_batch(cfg, 2, 5, 6)
  runner, _ = train_bench.build_step(cfg, batch)
  first = fingerprint.closure_fingerprint(runner.train_jit._fun)  # pylint: disable=protected-access
  other = dataclasses.replace(cfg, dropout_rate=cfg.dropout_rate + 0.1)
  runner2, _ = train_bench.build_step(other, batch)
  assert first != fingerprint.closure_fingerprint(runner2.train_jit._fun)  # pylint: disable=protected-access


# ------------------------------------------------------------------ in process: like jax.jit

def test_static_arguments_select_their_own_program():
  @functools.partial(program_cache.cached_jit, static_argnums=(1,))
  def power(x, n):
    return x ** n

  x = jnp.arange(1.0, 4.0)
  np.testing.assert_array_equal(power(x, 2), np.arange(1.0, 4.0) ** 2)
  np.testing.assert_array_equal(power(x, 3), np.arange(1.0, 4.0) ** 3)  # not the n=2 program
  np.testing.assert_array_equal(power(jnp.arange(1.0, 3.0), 3), np.arange(1.0, 3.0) ** 3)


def test_inside_a_trace_it_is_staged_not_run():
  traced = []

  @program_cache.cached_jit
  def double(x):
    traced.append(1)
    return 2 * x

  out = jax.eval_shape(lambda: double(jnp.ones((3,))))
  assert out.shape == (3,) and isinstance(out, jax.ShapeDtypeStruct)
  np.testing.assert_array_equal(jax.jit(lambda y: double(y) + 1)(jnp.ones(3)), np.full(3, 3.0))


def test_the_arrays_a_kept_program_returns_can_be_differentiated(tmp_path):
  """A program written and read back as the cache does (``_write``, ``_load``) returns arrays that
  ``jax.grad`` takes: on jax 0.12.1 their avals held a pickled copy of the ``AutoLayout``
  singleton, unequal to it, and the gradient of a product with them raised "Expected cotangent
  type float32[3,2] but got float32[3,2]"."""
  from jax.experimental import serialize_executable
  init = jax.jit(lambda: jnp.arange(6.0).reshape(3, 2))
  compiled = init.lower().compile()
  path = str(tmp_path / "init.program")
  payload, in_tree, out_tree = serialize_executable.serialize(compiled)
  program_cache._write(path, (payload, in_tree, out_tree, [jax.devices()[0].id]))
  w = program_cache._load(path)()
  x = np.arange(12.0, dtype=np.float32).reshape(4, 3)
  grad = jax.grad(lambda w: jnp.sum(jnp.asarray(x) @ w))(w)
  np.testing.assert_array_equal(np.asarray(grad), np.repeat(x.sum(0)[:, None], 2, axis=1))


# ----------------------------------------------------------------- across processes

# a state-donating step kept through the program cache; prints its result's bits, whether the
# step was traced in this process and whether the donated input was consumed
SCRIPT = """
import hashlib, json, os, sys, jax, jax.numpy as jnp
from txf.runtime import compile_cache, fingerprint, program_cache
compile_cache.apply(jax.config)
traced = []

def step(state, x):
  traced.append(1)
  w = state["w"]
  for _ in range(3):
    w = jnp.tanh(w @ x + 0.5 * w)
  return {"w": w}, jnp.sum(w)

jitted = program_cache.CachedJit(step, donate_argnums=(0,))
state = {"w": jnp.arange(16.0).reshape(4, 4) / 16}
x = jnp.eye(4) * 0.3
jitted.prefetch(jax.eval_shape(lambda: state), x)
new, total = jitted(state, x)
new, total = jitted(new, x)
print(json.dumps({"bits": hashlib.sha256(jax.device_get(new["w"]).tobytes()).hexdigest(),
                  "total": float(total), "traced": len(traced),
                  "donated": state["w"].is_deleted()}))
"""


def _python(cache, devices=1):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", compile_cache.ENV: cache, compile_cache.ENV_MIN_SECS: "0"}
  if devices > 1:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
  return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                        cwd=ROOT, timeout=120)


def _programs(cache):
  return sorted(glob.glob(os.path.join(cache, "*", program_cache.SUBDIR, "*.program")))


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_a_kept_program_is_read_back_whole_and_a_bad_one_is_one_line(tmp_path):
  cache = str(tmp_path / "cache")
  cold = _python(cache)
  assert cold.returncode == 0 and cold.stderr == "", cold.stderr
  first = json.loads(cold.stdout)
  assert first["traced"] == 1 and first["donated"]
  kept = _programs(cache)
  assert len(kept) == 1, kept

  warm = _python(cache)  # nothing traced: the program came back from the cache
  assert warm.returncode == 0 and warm.stderr == "", warm.stderr
  assert json.loads(warm.stdout) == {**first, "traced": 0}
  assert _programs(cache) == kept

  off = _python("off")  # the same bits as plain jax.jit
  assert json.loads(off.stdout)["bits"] == first["bits"]

  with open(kept[0], "wb") as f:  # an unreadable entry: one line, compiled by XLA and kept again
    f.write(b"\x00not a program")
  broken = _python(cache)
  assert broken.returncode == 0, broken.stderr
  assert json.loads(broken.stdout) == first
  lines = broken.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "txf: warning: compilation cache: an entry could not be read"), broken.stderr
  assert _programs(cache) == kept  # replaced (jax's cache did not hand it back: next test)
  healed = _python(cache)
  assert healed.stderr == "" and json.loads(healed.stdout) == {**first, "traced": 0}


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_a_program_from_jax_s_own_cache_is_not_kept(tmp_path):
  """XLA:CPU serialises an executable it read back from jax's cache without some of its
  functions: such a program is used, never kept (the next process reads jax's entry again)."""
  cache = str(tmp_path / "cache")
  assert _python(cache).returncode == 0
  for path in _programs(cache):
    os.remove(path)
  again = _python(cache)  # jax's cache hands the step back: used, not kept
  assert again.returncode == 0 and again.stderr == "", again.stderr
  assert json.loads(again.stdout)["traced"] == 1
  assert _programs(cache) == []
  third = _python(cache)
  assert third.returncode == 0 and third.stderr == "", third.stderr


def test_the_folder_is_bounded_least_recently_used_first(tmp_path):
  for i, size in enumerate((300, 300, 300)):
    path = tmp_path / f"{i}.program"
    path.write_bytes(b"x" * size)
    os.utime(path, ns=(10**18 + i, 10**18 + i))
  program_cache._evict(str(tmp_path), 700)  # pylint: disable=protected-access
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1.program", "2.program"]


@pytest.mark.parametrize("seed", [0, 1, 42, 2 ** 31 - 1, -7, 2 ** 40])
def test_the_run_s_keys_are_the_eager_split_s_bits(seed):
  from txf.train.steps import run_keys  # pylint: disable=import-outside-toplevel
  expected = jax.random.split(jax.random.key(seed))
  got = run_keys(seed)
  for want, have in zip(expected, got):
    np.testing.assert_array_equal(jax.random.key_data(have), jax.random.key_data(want))


@pytest.mark.slow  # end to end (a txf process or more): the slow tier
def test_on_a_host_of_several_devices_a_kept_program_runs_on_the_one_it_was_built_for(tmp_path):
  cache = str(tmp_path / "cache")
  cold = _python(cache, devices=8)
  assert cold.returncode == 0 and cold.stderr == "", cold.stderr
  warm = _python(cache, devices=8)
  assert warm.returncode == 0 and warm.stderr == "", warm.stderr
  assert json.loads(warm.stdout) == {**json.loads(cold.stdout), "traced": 0}


def test_a_closure_it_cannot_describe_is_plain_jit(tmp_path):
  class Opaque:
    __slots__ = ()
    scale = 3.0

  thing = Opaque()
  jitted = program_cache.CachedJit(lambda x: x * thing.scale)
  np.testing.assert_array_equal(jitted(jnp.ones(2)), np.full(2, 3.0))
  np.testing.assert_array_equal(jitted(jnp.ones(3)), np.full(3, 3.0))
  assert jitted._plain and not jitted._programs  # pylint: disable=protected-access


def _cell(source):
  """What a notebook cell defines: functions and classes of a module with no source file."""
  namespace = {"__name__": "notebook_cell", "jnp": jnp}
  exec(source, namespace)  # pylint: disable=exec-used
  return namespace


def test_code_defined_in_a_notebook_is_described_by_its_body():
  fp = fingerprint.closure_fingerprint
  cell = _cell("def helper(x):\n  return x * 2\n\ndef step(x):\n  return helper(x) + 1\n")
  before = fp(cell["step"])
  exec("def helper(x):\n  return x * 3\n", cell)  # the helper cell run again, changed
  assert fp(cell["step"]) != before
  model = _cell("class Model:\n  scale = 2.0\n  def __call__(self, x):\n    return x * self.scale\n")
  other = _cell("class Model:\n  scale = 2.0\n  def __call__(self, x):\n    return x / self.scale\n")
  assert fp(model["Model"]) != fp(other["Model"])


def test_a_write_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
  def full_disk(*_, **__):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(program_cache.pickle, "dump", full_disk)
  with pytest.raises(OSError):
    program_cache._write(str(tmp_path / "p" / "k.program"), ("entry",))  # pylint: disable=protected-access
  assert os.listdir(tmp_path / "p") == []


def test_eval_shape_s_result_is_kept_and_follows_the_closure(tmp_path, monkeypatch):
  monkeypatch.setattr(program_cache, "folder", lambda: str(tmp_path))
  traced, real = [], jax.eval_shape
  monkeypatch.setattr(jax, "eval_shape", lambda f, *a: traced.append(a[0].shape) or real(f, *a))

  def shapes_of(width):
    return lambda x: {"w": jnp.zeros((x.shape[0], width)), "b": jnp.zeros((width,), jnp.int32)}

  x = jax.ShapeDtypeStruct((3, 2), jnp.float32)
  first = program_cache.cached_eval_shape(shapes_of(4), x)
  again = program_cache.cached_eval_shape(shapes_of(4), x)  # read back, not traced
  assert len(traced) == 1
  assert first == again == {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32),
                            "b": jax.ShapeDtypeStruct((4,), jnp.int32)}
  other = program_cache.cached_eval_shape(shapes_of(5), x)  # another closure: traced
  assert len(traced) == 2 and other["w"].shape == (3, 5)
  wider = program_cache.cached_eval_shape(shapes_of(4), jax.ShapeDtypeStruct((7, 2), jnp.float32))
  assert len(traced) == 3 and wider["w"].shape == (7, 4)  # other argument shapes: traced
  assert len(glob.glob(str(tmp_path / "*.shapes"))) == 3


def test_a_binding_changed_at_run_time_changes_the_code_fingerprint(monkeypatch):
  """A monkeypatched initializer (a wrapper that copies the name of the function it wraps), a
  replaced method and a changed constant each give another key; undone, the key comes back."""
  from txf.nn import attention, layers  # pylint: disable=import-outside-toplevel
  before = fingerprint.code_fingerprint()
  with monkeypatch.context() as m:
    m.setattr(attention, "OUT_INIT", attention.xavier)
    assert fingerprint.code_fingerprint() != before
  assert fingerprint.code_fingerprint() == before
  some_class = next(v for v in vars(layers).values()
                    if isinstance(v, type) and v.__module__ == layers.__name__ and "__call__" in vars(v))
  with monkeypatch.context() as m:
    m.setattr(some_class, "__call__", lambda self, *a, **k: None)
    assert fingerprint.code_fingerprint() != before
  with monkeypatch.context() as m:
    m.setattr(program_cache, "SUBDIR", "elsewhere")
    assert fingerprint.code_fingerprint() != before
  assert fingerprint.code_fingerprint() == before


@pytest.mark.slow  # end to end (subprocesses, whole runs or many programs): the slow tier
def test_the_fingerprint_is_the_same_in_every_process():
  """Each process seeds string hashing anew, so a set literal in code iterates in another order:
  the fingerprint of code holding one, and of txf's modules, must not follow it."""
  script = ("from txf.runtime import fingerprint\n"
            "def f(x):\n  return x in {'alpha', 'beta', 'gamma', 'delta'}\n"
            "import txf.train.loop\n"
            "print(fingerprint.closure_fingerprint(f), fingerprint.code_fingerprint())")
  outs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": str(seed)},
                         timeout=120).stdout for seed in (1, 2, 3)}
  assert len(outs) == 1 and len(next(iter(outs)).split()) == 2, outs
