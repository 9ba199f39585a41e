"""Train-step speed and memory, and the machine's matmul peak measured in the same process.

  txf bench --configs small,base          (or: python -m bench --configs small,base)

For one model config, :func:`train_benchmark` builds the real train step
(``txf.train.steps.make_train_step``: label-smoothed loss, Adam, the non-finite guard), compiles it
ahead of time with the state donated exactly as ``SingleDeviceRunner`` does, and times steps on a
fixed random batch (every position a real token). It reports

* ``compile_s``: trace + lower + XLA compile of the step (``jit(...).lower(...).compile()``);
* ``step_s_best`` / ``step_s_median``: seconds per step (each step blocked on), best and median;
* tokens/s: target tokens (the loss's tokens) and source + target tokens per second (best step);
* FLOPs per step two ways: ``flops_xla`` from the compiled program's ``cost_analysis()`` (every
  HLO op, elementwise included) and ``flops_model`` from :func:`model_train_flops` (the matmuls
  only, the usual "model FLOPs" of MFU);
* MFU = flops_model / step_s_best / matmul peak, against the fp32 and the bf16 peak that
  :func:`matmul_peak` measured in the same run;
* memory: the compiled program's ``memory_analysis()`` (arguments, outputs, temporaries, peak) and
  the process's max RSS so far (``resource.getrusage``; it only grows, so later rows include earlier).

Timings on a shared machine are contaminated by the other processes: every result carries the
1-minute load average before and after (``os.getloadavg``); compare figures only at similar load.
"""

import dataclasses
import resource
import statistics
import time
import warnings
from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bench.decode import CONFIGS as MODEL_SIZES
from txf.nn import TransformerConfig
from txf.core import config as config_lib
from txf.runtime.machine import load_average, machine_info  # noqa: F401 (bench.run reads them here)
from txf.models import init_params
from txf.models.flops import model_train_flops
from txf.parallel.runners import SingleDeviceRunner
from txf.train.optimizer import inverse_sqrt_schedule, make_optimizer
from txf.train.steps import create_train_state, make_eval_step, make_train_step

# The benchmarked shapes: model sizes shared with bench/decode.py, plus batch and lengths.
BENCH_CONFIGS = {
    "small": dict(model=MODEL_SIZES["small"], batch=64, source_len=32, target_len=32),
    "base": dict(model=MODEL_SIZES["base"], batch=32, source_len=64, target_len=64),
    # Transformer-Tiny as issue #40 times it: ~4k tokens a side per update (packed rows of 64;
    # multi30k_en_de_tiny.py now takes 8k, the paper's), dropout 0.3, one table for both languages
    "transformer_tiny": dict(model=dict(MODEL_SIZES["transformer_tiny"], dropout_rate=0.3),
                             batch=64, source_len=64, target_len=64),
    # for smoke tests of the benchmark code only (seconds to compile and run)
    "tiny": dict(model=dict(d_model=32, num_encoder_layers=1, num_decoder_layers=1, num_heads=2,
                            d_ff=64, vocab_size=64), batch=4, source_len=8, target_len=8),
}


def matmul_peak(dtype: str = "float32", n: int = 2048, repeats: int = 8,
                max_seconds: float = 20.0) -> Dict[str, float]:
  """The machine's matmul throughput: an [n, n] @ [n, n] jnp.dot (2 n^3 FLOPs) timed ``repeats``
  times after a warm-up (fewer once ``max_seconds`` are spent); best and median GFLOP/s.

  For bfloat16 the inputs and output are bfloat16 (what XLA runs for model.dtype='bfloat16').
  """
  probe = matmul_probe(dtype, n)
  times, cpu = [], []
  load = load_average()
  while len(times) < repeats and (len(times) < 2 or sum(times) < max_seconds):
    start_cpu = time.process_time()
    times.append(probe())
    cpu.append(time.process_time() - start_cpu)
  flops = 2.0 * n ** 3
  return {"dtype": dtype, "n": n, "runs": len(times), "gflops_best": flops / min(times) / 1e9,
          "gflops_median": flops / statistics.median(times) / 1e9,
          "gflops_per_cpu_s": flops / statistics.median(cpu) / 1e9, "load_before": load,
          "load_after": load_average()}


def matmul_probe(dtype: str = "float32", n: int = 2048) -> Callable[[], float]:
  """A compiled [n, n] @ [n, n] jnp.dot (warmed up); calling the probe runs it once and returns
  the seconds it took (2 n^3 FLOPs)."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, b))

  def probe() -> float:
    start = time.perf_counter()
    jax.block_until_ready(dot(a, b))
    return time.perf_counter() - start

  probe.flops = 2.0 * n ** 3
  return probe


def random_batch(cfg: TransformerConfig, batch: int, source_len: int, target_len: int,
                 seed: int = 0) -> Dict[str, np.ndarray]:
  """Host batch of random real tokens (ids 4..V-1, no padding): {"inputs": [B, S], "targets": [B, T]}."""
  rng = np.random.default_rng(seed)
  out = {"targets": rng.integers(4, cfg.tgt_vocab_size, (batch, target_len)).astype(np.int32)}
  if cfg.family != "decoder_lm":
    out["inputs"] = rng.integers(4, cfg.vocab_size, (batch, source_len)).astype(np.int32)
  return out


def _cost_flops(compiled) -> Optional[float]:
  """The ``flops`` entry of a compiled program's cost analysis (a dict, or a list of one dict)."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except  # best effort, backend-dependent
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def _memory(compiled) -> Dict[str, float]:
  """MiB figures of ``compiled.memory_analysis()`` (empty if the backend gives none)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if m is None:
    return {}
  mib = lambda x: round(x / 2 ** 20, 1)
  out = {"arguments_mib": mib(m.argument_size_in_bytes), "outputs_mib": mib(m.output_size_in_bytes),
         "aliased_mib": mib(m.alias_size_in_bytes), "temp_mib": mib(m.temp_size_in_bytes)}
  # arguments + outputs not aliased to arguments + temporaries: all live at the peak, at most
  bound = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
           + m.temp_size_in_bytes)
  out["peak_mib"] = mib(max(getattr(m, "peak_memory_in_bytes", 0), bound))
  return out


def max_rss_mib() -> float:
  """The process's peak resident memory so far (Linux reports KiB)."""
  return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def build_step(model_cfg: TransformerConfig, batch: Dict[str, np.ndarray], seed: int = 0):
  """(jitted train step with the state donated, the initial state, tx) for ``model_cfg``.

  The optimizer and loss are the base experiment config's (Adam 0.9/0.98/1e-9, inverse-sqrt
  warmup, label smoothing 0.1): the step is the one ``txf train`` runs.
  """

  opt = config_lib.base_config().optimizer
  schedule = inverse_sqrt_schedule(model_cfg.d_model, opt.warmup_steps, opt.learning_rate_scale)
  tx = make_optimizer(opt, model_cfg.d_model)
  runner = SingleDeviceRunner(make_train_step(model_cfg, tx, opt.label_smoothing, schedule),
                              make_eval_step(model_cfg, opt.label_smoothing))
  new_state = lambda: create_train_state(init_params(model_cfg, jax.random.key(seed), batch), tx)
  # a kept train step loads on a thread while the parameters are initialised
  runner.prefetch(jax.eval_shape(new_state), batch, jax.random.key(1))
  return runner, runner.place_state(new_state())


def train_benchmark(name: str, model_cfg: TransformerConfig, batch_size: int, source_len: int,
                    target_len: int, steps: int = 5, warmup: int = 2, max_seconds: float = 60.0,
                    peaks: Optional[Dict[str, float]] = None,
                    probes: Optional[Dict[str, Callable[[], float]]] = None) -> Dict[str, object]:
  """Compile and time the train step of ``model_cfg`` on a [batch_size, source/target_len] batch.

  ``steps`` timed steps after ``warmup`` untimed ones (fewer once ``max_seconds`` are spent; at
  least 2); ``peaks``: {"float32": GFLOP/s, "bfloat16": GFLOP/s} for the ``mfu_<dtype>`` fields.
  ``probes``: {dtype: :func:`matmul_probe`}: after every timed step the probe's matmul runs 3
  times, and ``mfu_paired_<dtype>`` is the median over steps of (step model GFLOP/s) / (the best
  of those 3 matmul GFLOP/s): a step and its peak share the machine's load of that moment (the
  first matmul after a step runs ~25% slower, cold caches: hence the best of 3).
  Returns one result row (see the module docstring for the fields).
  """
  batch = random_batch(model_cfg, batch_size, source_len, target_len)
  runner, state = build_step(model_cfg, batch)
  rng = jax.random.key(1)
  load_before = load_average()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    start = time.perf_counter()
    lowered = runner.train_jit.lower(state, batch, rng)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    for _ in range(max(warmup, 1)):
      old_leaf = jax.tree_util.tree_leaves(state.params)[0]
      state, metrics = compiled(state, batch, rng)
      jax.block_until_ready(metrics)
  donation_warnings = [str(w.message) for w in caught if "donat" in str(w.message).lower()]
  donated = old_leaf.is_deleted()
  flops_model = model_train_flops(model_cfg, batch_size, source_len, target_len)
  times, cpu, paired = [], [], {dtype: [] for dtype in (probes or {})}
  while len(times) < max(steps, 2) and (len(times) < 2 or sum(times) < max_seconds):
    start, start_cpu = time.perf_counter(), time.process_time()
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
    for dtype, probe in (probes or {}).items():  # the first matmul after a step runs ~25% slow
      paired[dtype].append((flops_model / times[-1]) / (probe.flops / min(probe() for _ in range(3))))
  best, median, cpu_s = min(times), statistics.median(times), statistics.median(cpu)
  tgt_tokens = batch_size * target_len
  all_tokens = tgt_tokens + (batch_size * source_len if model_cfg.family != "decoder_lm" else 0)
  flops_xla = _cost_flops(compiled)
  row = {"config": name, "dtype": model_cfg.dtype, "attention_impl": model_cfg.attention_impl,
         "batch": batch_size, "source_len": source_len, "target_len": target_len,
         "params": int(sum(x.size for x in jax.tree_util.tree_leaves(state.params))),
         "compile_s": compile_s, "steps": len(times), "step_s_best": best, "step_s_median": median,
         "target_tokens_per_s": tgt_tokens / best, "tokens_per_s": all_tokens / best,
         "target_tokens_per_s_median": tgt_tokens / median,
         "flops_model": flops_model, "flops_xla": flops_xla,
         "model_gflops_per_s": flops_model / best / 1e9, "step_cpu_s": cpu_s,
         "model_gflops_per_cpu_s": flops_model / cpu_s / 1e9,
         "loss": float(metrics["loss"]), "donated": bool(donated),
         "donation_warnings": donation_warnings, "memory": _memory(compiled),
         "max_rss_mib": max_rss_mib(), "load_before": load_before, "load_after": load_average()}
  for dtype, gflops in (peaks or {}).items():
    row[f"mfu_{dtype}"] = flops_model / best / 1e9 / gflops
  for dtype, ratios in paired.items():
    row[f"mfu_paired_{dtype}"] = statistics.median(ratios)
    row[f"mfu_paired_{dtype}_all"] = ratios
  return row


def config_for(name: str, dtype: str = "float32", attention_impl: str = "reference",
               family: str = "encoder_decoder") -> TransformerConfig:
  """The TransformerConfig of a named bench config (dropout as in training: its own, else 0.1)."""
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  sizes = {k: v for k, v in BENCH_CONFIGS[name]["model"].items() if k in fields}
  return TransformerConfig(family=family, dtype=dtype, attention_impl=attention_impl, **sizes)
