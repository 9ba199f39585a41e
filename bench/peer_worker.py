"""txf's side of the peer sitting (``python -m bench.peers --worker``): the train step and
cached decoding on the peers' shapes, printed as JSON lines in the peer harnesses' format.

Train: the real step (txf.train.steps: dropout 0.1, label smoothing 0.1, Adam) on the issue's
shapes, first step (trace + compile + step) and the median of timed steps. Decode: 16 random
sources of 32 tokens, 32 output tokens (EOS never emitted), one call = encoder + cache + search,
parameters prepared once and passed as arguments (bench.decode.decoder).
"""

import dataclasses
import json
import statistics
import time
from typing import Dict, Sequence

import jax
import jax.numpy as jnp

from bench import train as train_bench
from bench.decode import decode_fn, decoder, prepared
from txf.models import init_params

DECODE_BATCH, DECODE_SRC, DECODE_OUT, DECODE_BEAM = 16, 32, 32, 4


def _stats(times: Sequence[float]) -> Dict[str, float]:
  return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def _rate(n: int, st: Dict[str, float]) -> Dict[str, float]:
  return {"median": n / st["median"], "min": n / st["max"], "max": n / st["min"]}


def decode_inputs(cfg) -> jnp.ndarray:
  """The sitting's decode sources: int32 [DECODE_BATCH, DECODE_SRC], random ids 4..V-1."""
  return jax.random.randint(jax.random.key(2), (DECODE_BATCH, DECODE_SRC), 4, cfg.vocab_size,
                            jnp.int32)


def program_beam(program: str) -> int:
  """The beam size of a decode program's name: "greedy" -> 1, "beamK" -> K (K >= 1); ValueError
  for any other name."""
  if program == "greedy":
    return 1
  if program.startswith("beam") and program[4:].isdigit() and int(program[4:]) >= 1:
    return int(program[4:])
  raise ValueError(f"a decode program is greedy or beamK (K >= 1), got {program!r}")


def decode_program(config: str, program: str, dtype: str = "float32"):
  """(jit'd fn, params, inputs): the decode call the sitting times, fn(params, inputs) -> ids,
  for bench config ``config`` and ``program`` "greedy" or "beamK"; the parameters are the
  worker's (random, key 0) laid out for decoding (:func:`bench.decode.prepared`)."""
  beam = program_beam(program)
  cfg = train_bench.config_for(config, dtype, "auto")
  shape = train_bench.BENCH_CONFIGS[config]
  batch = train_bench.random_batch(cfg, 1, shape["source_len"], shape["target_len"])
  params = init_params(cfg, jax.random.key(0), batch)
  cfg, params = prepared(cfg, params, True)
  fn = decode_fn(cfg, program, True, DECODE_BATCH, DECODE_OUT, beam)
  return fn, params, decode_inputs(cfg)


def worker(config: str, steps: int, decode_reps: int, warmup: int = 2, dtype: str = "float32",
           bf16_decode: bool = False, attention_dropout: float = 0.0, decode: bool = True,
           name: str = "txf", say=print) -> None:
  """txf's measurements at one config, printed as JSON lines in the peers' format (``peer`` =
  ``name``); with ``bf16_decode`` also beam 4 with bfloat16 weights (method "beam-bf16").
  ``dtype``: the compute dtype; ``attention_dropout``: dropout on the attention weights (the
  peers' placement; 0 = the paper's); ``decode=False``: the train step only."""
  cfg = dataclasses.replace(train_bench.config_for(config, dtype, "auto"),
                            attention_dropout_rate=attention_dropout)
  shape = train_bench.BENCH_CONFIGS[config]
  b, s, t = shape["batch"], shape["source_len"], shape["target_len"]
  batch = train_bench.random_batch(cfg, b, s, t)
  runner, state = train_bench.build_step(cfg, batch)
  rng = jax.random.key(1)
  start = time.perf_counter()
  state, metrics = runner.train_jit(state, batch, rng)  # trace + compile + the first step
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  for _ in range(warmup):
    state, metrics = runner.train_jit(state, batch, rng)
    jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, metrics = runner.train_jit(state, batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  st = _stats(times)
  say(json.dumps(dict(peer=name, config=config, phase="train", dtype=dtype, jax=jax.__version__,
                      attention_dropout=attention_dropout, first_step_s=first, step_s=st,
                      tokens_per_s=_rate(b * t, st), loss=float(metrics["loss"]))), flush=True)
  del state, runner
  if not decode:
    return

  params = init_params(cfg, jax.random.key(0), {k: v[:1] for k, v in batch.items()})
  inputs = decode_inputs(cfg)
  for method in ("beam", "greedy") + (("beam-bf16",) if bf16_decode else ()):
    run = decoder(cfg, params, "greedy" if method == "greedy" else f"beam{DECODE_BEAM}", True,
                  DECODE_BATCH, DECODE_OUT, DECODE_BEAM,
                  weights_dtype="bfloat16" if method == "beam-bf16" else None)
    start = time.perf_counter()
    jax.block_until_ready(run(inputs))
    first = time.perf_counter() - start
    times = []
    for _ in range(decode_reps):
      start = time.perf_counter()
      jax.block_until_ready(run(inputs))
      times.append(time.perf_counter() - start)
    st = _stats(times)
    say(json.dumps(dict(peer=name, config=config, phase="decode", method=method,
                        beam=1 if method == "greedy" else DECODE_BEAM, batch=DECODE_BATCH,
                        src_len=DECODE_SRC, first_call_s=first, batch_s=st,
                        out_tokens_per_s=_rate(DECODE_BATCH * DECODE_OUT, st))), flush=True)
