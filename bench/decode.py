"""Decode speed: greedy and beam search, with the KV cache and without, at two output lengths.

  python -m bench.decode --config small --batch 8
  python -m bench.decode --config transformer_tiny --batch 32 --beam 5 --lengths 32 \
    --num_kv_heads 4 2 1
  python -m bench.decode --config small --batch 16 --lengths 32 --weights_dtypes float32 bfloat16

Prints decode tokens/s (output tokens of the batch, B * L, per second of steady-state time; beam
search runs B * K rows to produce them), compile seconds (``jit(...).lower().compile()``, apart
from the timed runs), and the per-token cost ratio between the longest and the shortest length:
~1 when a step costs the same at every length, ~L_long / L_short when it grows with the length.

The uncached baseline uses the same greedy/beam code with txf.decode.adapter's uncached callback
(:func:`~txf.decode.adapter.make_uncached_logits_fn`): its "cache" holds only the token buffer
[N, max_len] (and the encoder output, computed once), and each step re-runs the whole decoder over
that fixed-size buffer (positions after the current one are masked by causality), so one compiled
step serves all steps. Only the needed position goes through the output projection. Decoding is forced to the
asked length with ``eos_id=-1`` (never produced). The model is randomly initialised.

The cached decoder's parameters are prepared once
(:func:`~txf.decode.adapter.prepare_for_decoding`: optional bf16 cast, transposed output table)
and passed to the jit'd call as arguments, beam search with the model's beam-layout cache
(:func:`~txf.decode.adapter.expand_cache` / :func:`~txf.decode.adapter.reorder_cache`).
``txf translate`` passes the model's own parameters and, with ``--decode_dtype``, casts them inside
the call; ``--weights_dtypes`` times that path.
"""

import argparse
import dataclasses
import os
import statistics
import time
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp

from txf.decode import DecodingSpec, beam_search, gather_rows, greedy_decode
from txf.decode.decoders import decoding_model
from txf.decode.adapter import (cast_for_decoding, expand_cache, init_cache, init_uncached_cache,
                                make_logits_fn, make_uncached_logits_fn, prepare_for_decoding,
                                reorder_cache)
from txf.models import init_params
from txf.nn import TransformerConfig

CONFIGS = {
    "small": dict(d_model=256, num_encoder_layers=3, num_decoder_layers=3, num_heads=4, d_ff=1024,
                  vocab_size=8000),
    "base": dict(d_model=512, num_encoder_layers=6, num_decoder_layers=6, num_heads=8, d_ff=2048,
                 vocab_size=32000),
    # Transformer-Tiny (experiments/multi30k_en_de_tiny.py): the joint 8k vocabulary, one table
    "transformer_tiny": dict(d_model=128, num_encoder_layers=4, num_decoder_layers=4, num_heads=4,
                             d_ff=256, vocab_size=8000, share_embeddings=True),
}


def decode_fn(cfg, method: str, cached: bool, batch: int, length: int, beam: int,
              spec: DecodingSpec = DecodingSpec()):
  """jit'd ``run(params, inputs [B, S]) -> ids``: build the cache (encoder included), decode
  ``length`` tokens. ``params``: the model's, or :func:`~txf.decode.adapter.prepare_for_decoding`'s
  (with its ``cfg``); ``spec.weights_dtype`` casts them inside the call, as ``txf translate``
  does (:func:`txf.decode.decoders.decoding_model`)."""
  def run(params, inputs):
    cfg_, params = decoding_model(cfg, params, spec)
    return _run(cfg_, params, inputs)

  def _run(cfg, params, inputs):
    if cached:
      cache, fn = init_cache(cfg, params, batch, length, inputs), make_logits_fn(cfg, params)
    else:
      cache = init_uncached_cache(cfg, params, batch, length, inputs)
      fn = make_uncached_logits_fn(cfg, params)
    if method == "greedy":
      return greedy_decode(fn, cache, batch, length, eos_id=-1)
    if not cached:
      return beam_search(fn, cache, batch, beam, length, eos_id=-1, reorder_cache=gather_rows)[0]
    return beam_search(fn, cache, batch, beam, length, eos_id=-1, expand_cache=expand_cache,
                       reorder_cache=reorder_cache)[0]
  return jax.jit(run)


def prepared(cfg, params, cached: bool = True, weights_dtype: Optional[str] = None):
  """(cfg, params) as a user decodes with them: made once, before any timed call.

  Cached decoding takes :func:`~txf.decode.adapter.prepare_for_decoding`'s (weights cast to
  ``weights_dtype`` if given, the transposed output table); the uncached baseline the model's own
  parameters (cast if asked)."""
  if cached:
    cfg, params = prepare_for_decoding(cfg, params, weights_dtype)
  elif weights_dtype is not None:
    cfg, params = cast_for_decoding(cfg, params, weights_dtype)
  return cfg, jax.block_until_ready(params)


def decoder(cfg, params, method: str, cached: bool, batch: int, length: int, beam: int,
            weights_dtype: Optional[str] = None):
  """``run(inputs [B, S]) -> ids``: one call builds the cache (encoder included) and decodes.

  The parameters are prepared once here (:func:`prepared`: ``weights_dtype`` e.g. "bfloat16"
  casts them), outside the call, and passed to the jit'd function as arguments."""
  cfg, params = prepared(cfg, params, cached, weights_dtype)
  fn = decode_fn(cfg, method, cached, batch, length, beam)
  return lambda inputs: fn(params, inputs)


def decode_benchmark(model_cfg: TransformerConfig, batch_size: int,
                     output_lengths: Sequence[int] = (32, 128), beam_size: int = 4,
                     repeats: int = 3, source_len: int = 32, max_seconds: float = 30.0,
                     seed: int = 0) -> List[dict]:
  """Time greedy and beam decoding with and without the KV cache.

  For every (method, cached, length): compile once (``compile_s``), then run ``repeats`` times
  (fewer once ``max_seconds`` of runs are spent; at least one) and keep the median ``seconds``.
  tokens_per_s = batch_size * length / seconds; ms_per_token = 1000 * seconds / length (one
  decode step of the whole batch). On the longest length's rows, ``per_token_ratio`` =
  ms_per_token(longest) / ms_per_token(shortest).

  Args:
    model_cfg: sizes (family encoder_decoder or decoder_lm); max_len is raised to the longest
      output length if needed; dropout is off.
    batch_size: B; output_lengths: tokens to generate; beam_size: K for the beam rows.
    repeats, max_seconds: timing runs per case; source_len: random source length (enc-dec).
  Returns:
    list of dict rows: method, cached, length, batch, compile_s, seconds, runs, tokens_per_s,
    ms_per_token (+ per_token_ratio on the longest length).
  """
  cfg = dataclasses.replace(model_cfg, max_len=max(model_cfg.max_len, *output_lengths))
  rng_params, rng_src = jax.random.split(jax.random.key(seed))
  inputs = None
  example = {"targets": jnp.ones((1, 8), jnp.int32)}
  if cfg.family == "encoder_decoder":
    inputs = jax.random.randint(rng_src, (batch_size, source_len), 4, cfg.vocab_size, jnp.int32)
    example["inputs"] = jnp.ones((1, 8), jnp.int32)
  params = init_params(cfg, rng_params, example)
  rows = []
  for method in ("greedy", f"beam{beam_size}"):
    for cached in (True, False):
      for length in output_lengths:
        cfg_, params_ = prepared(cfg, params, cached)
        run = decode_fn(cfg_, method, cached, batch_size, length, beam_size)
        start = time.perf_counter()
        compiled = run.lower(params_, inputs).compile()
        compile_s = time.perf_counter() - start
        times = []
        while len(times) < max(repeats, 1) and (not times or sum(times) < max_seconds):
          start = time.perf_counter()
          jax.block_until_ready(compiled(params_, inputs))
          times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        rows.append(dict(method=method, cached=cached, length=length, batch=batch_size,
                         compile_s=compile_s, seconds=seconds, runs=len(times),
                         tokens_per_s=batch_size * length / seconds,
                         ms_per_token=1000 * seconds / length))
      short, long = rows[-len(output_lengths)], rows[-1]
      long["per_token_ratio"] = long["ms_per_token"] / short["ms_per_token"]
  return rows


def cache_bytes(cfg, params, batch_size: int, length: int, beam: int, inputs) -> int:
  """Bytes of beam search's decode cache for ``batch_size`` sources (every leaf of
  ``expand_cache(init_cache(...), beam)``, shapes only): per decoder layer the self-attention K/V
  [B, h_kv, beam·length, d_k] and the cross-attention K/V [B, h_kv, S, d_k], with h_kv =
  ``num_kv_heads``, plus the small per-row tables."""
  shapes = jax.eval_shape(
      lambda p, x: expand_cache(init_cache(cfg, p, batch_size, length, x), beam), params, inputs)
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(shapes))


def kv_heads_benchmark(model_cfg: TransformerConfig, kv_heads: Sequence[int], batch_size: int,
                       length: int, beam_size: int, rounds: int = 3, source_len: int = 32,
                       seed: int = 0) -> List[dict]:
  """Cached beam search with each ``num_kv_heads`` of ``kv_heads``, timed in alternating rounds.

  Each arm is compiled once (its own random parameters: W^K, W^V are [d, h_kv, d_k]); then
  ``rounds`` rounds each time every arm once, in order, so the arms share the machine's drifts.
  tokens_per_s = batch_size · length / median seconds; ``speedup`` = tokens_per_s / the first
  arm's; ``cache_mb`` = :func:`cache_bytes` at the full length.
  """
  rng_params, rng_src = jax.random.split(jax.random.key(seed))
  inputs = jax.random.randint(rng_src, (batch_size, source_len), 4, model_cfg.vocab_size, jnp.int32)
  example = {"targets": jnp.ones((1, 8), jnp.int32), "inputs": jnp.ones((1, 8), jnp.int32)}
  arms = []
  for h_kv in kv_heads:
    cfg = dataclasses.replace(model_cfg, num_kv_heads=h_kv, max_len=max(model_cfg.max_len, length))
    params = init_params(cfg, rng_params, example)
    cfg_, params_ = prepared(cfg, params, cached=True)
    start = time.perf_counter()
    compiled = decode_fn(cfg_, f"beam{beam_size}", True, batch_size, length,
                         beam_size).lower(params_, inputs).compile()
    arms.append(dict(run=lambda c=compiled, p=params_: c(p, inputs), times=[],
                     compile_s=time.perf_counter() - start,
                     cache=cache_bytes(cfg_, params_, batch_size, length, beam_size, inputs)))
  for _ in range(max(rounds, 1)):
    for arm in arms:
      start = time.perf_counter()
      jax.block_until_ready(arm["run"]())
      arm["times"].append(time.perf_counter() - start)
  rows = []
  for h_kv, arm in zip(kv_heads, arms):
    seconds = statistics.median(arm["times"])
    rows.append(dict(num_kv_heads=h_kv or model_cfg.num_heads, batch=batch_size, beam=beam_size,
                     length=length, compile_s=arm["compile_s"], seconds=seconds,
                     runs=len(arm["times"]), tokens_per_s=batch_size * length / seconds,
                     cache_mb=arm["cache"] / 2**20))
  for row in rows:
    row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
  return rows


def weights_benchmark(model_cfg: TransformerConfig, dtypes: Sequence[str], batch_size: int,
                      length: int, beam_size: int, rounds: int = 3, source_len: int = 32,
                      seed: int = 0) -> List[dict]:
  """Cached greedy and beam search with the weights cast to each of ``dtypes`` inside the call
  (``DecodingSpec.weights_dtype``, as ``txf translate --decode_dtype`` runs; "float32" = the
  float32 model as it is), timed in alternating rounds like :func:`kv_heads_benchmark`.

  One random float32 model; each (method, dtype) arm compiled once. Rows: method, weights,
  tokens_per_s (batch_size · length / median seconds), ``speedup`` over the first dtype's arm of
  the same method, ``same_ids`` (the arm's ids equal the first dtype's: 1.0 = all rows).
  """
  rng_params, rng_src = jax.random.split(jax.random.key(seed))
  cfg = dataclasses.replace(model_cfg, max_len=max(model_cfg.max_len, length))
  inputs = jax.random.randint(rng_src, (batch_size, source_len), 4, cfg.vocab_size, jnp.int32)
  params = init_params(cfg, rng_params, {"targets": jnp.ones((1, 8), jnp.int32),
                                         "inputs": jnp.ones((1, 8), jnp.int32)})
  arms = []
  for method in ("greedy", f"beam{beam_size}"):
    for dtype in dtypes:
      spec = DecodingSpec(weights_dtype="" if dtype == "float32" else dtype)
      start = time.perf_counter()
      compiled = decode_fn(cfg, method, True, batch_size, length, beam_size,
                           spec).lower(params, inputs).compile()
      arms.append(dict(method=method, weights=dtype, run=lambda c=compiled: c(params, inputs),
                       times=[], compile_s=time.perf_counter() - start))
  for arm in arms:
    arm["ids"] = jax.device_get(arm["run"]())
  for _ in range(max(rounds, 1)):
    for arm in arms:
      start = time.perf_counter()
      jax.block_until_ready(arm["run"]())
      arm["times"].append(time.perf_counter() - start)
  rows, first = [], {}
  for arm in arms:
    seconds = statistics.median(arm["times"])
    base = first.setdefault(arm["method"], dict(arm, seconds=seconds))
    rows.append(dict(method=arm["method"], weights=arm["weights"], batch=batch_size, length=length,
                     compile_s=arm["compile_s"], seconds=seconds, runs=len(arm["times"]),
                     tokens_per_s=batch_size * length / seconds, speedup=base["seconds"] / seconds,
                     same_ids=float((arm["ids"] == base["ids"]).all(axis=-1).mean())))
  return rows


def format_weights_table(rows: List[dict]) -> str:
  """:func:`weights_benchmark`'s rows as a fixed-width text table."""
  head = (f"{'method':<8} {'weights':<9} {'batch':>5} {'len':>4} {'compile s':>9} {'run s':>8} "
          f"{'runs':>4} {'tok/s':>9} {'speed-up':>8} {'same ids':>8}")
  lines = [head, "-" * len(head)]
  for r in rows:
    lines.append(f"{r['method']:<8} {r['weights']:<9} {r['batch']:>5} {r['length']:>4} "
                 f"{r['compile_s']:>9.2f} {r['seconds']:>8.3f} {r['runs']:>4} "
                 f"{r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x {r['same_ids']:>8.2f}")
  return "\n".join(lines)


def format_kv_table(rows: List[dict]) -> str:
  """:func:`kv_heads_benchmark`'s rows as a fixed-width text table."""
  head = (f"{'kv heads':>8} {'batch':>5} {'beam':>4} {'len':>4} {'compile s':>9} {'run s':>8} "
          f"{'runs':>4} {'tok/s':>9} {'speed-up':>8} {'cache MiB':>9}")
  lines = [head, "-" * len(head)]
  for r in rows:
    lines.append(f"{r['num_kv_heads']:>8} {r['batch']:>5} {r['beam']:>4} {r['length']:>4} "
                 f"{r['compile_s']:>9.2f} {r['seconds']:>8.3f} {r['runs']:>4} "
                 f"{r['tokens_per_s']:>9.1f} {r['speedup']:>7.2f}x {r['cache_mb']:>9.2f}")
  return "\n".join(lines)


def format_table(rows: List[dict]) -> str:
  """The rows as a fixed-width text table."""
  head = (f"{'method':<8} {'cache':<6} {'len':>4} {'batch':>5} {'compile s':>9} {'run s':>8} "
          f"{'runs':>4} {'tok/s':>9} {'ms/step':>8} {'ratio':>6}")
  lines = [head, "-" * len(head)]
  for r in rows:
    ratio = f"{r['per_token_ratio']:.2f}" if "per_token_ratio" in r else ""
    lines.append(f"{r['method']:<8} {'yes' if r['cached'] else 'no':<6} {r['length']:>4} "
                 f"{r['batch']:>5} {r['compile_s']:>9.2f} {r['seconds']:>8.3f} {r['runs']:>4} "
                 f"{r['tokens_per_s']:>9.1f} {r['ms_per_token']:>8.2f} {ratio:>6}")
  return "\n".join(lines)


def main(argv=None) -> None:
  """Command line: run :func:`decode_benchmark` on a named config and print the table."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
  parser.add_argument("--family", choices=("encoder_decoder", "decoder_lm"),
                      default="encoder_decoder")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128])
  parser.add_argument("--beam", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max_seconds", type=float, default=30.0)
  parser.add_argument("--source_len", type=int, default=32)
  parser.add_argument("--num_kv_heads", type=int, nargs="+", default=None,
                      help="compare cached beam search across these K/V head counts (0 = "
                           "num_heads) at the first of --lengths, in --repeats alternating rounds")
  parser.add_argument("--weights_dtypes", nargs="+", default=None,
                      choices=("float32", "bfloat16"),
                      help="compare cached greedy and beam decoding with the weights cast to each "
                           "(txf translate --decode_dtype) at the first of --lengths, in --repeats "
                           "alternating rounds")
  args = parser.parse_args(argv)
  cfg = TransformerConfig(family=args.family, **CONFIGS[args.config])
  print(f"decode benchmark: {args.config} {args.family} (d_model {cfg.d_model}, layers "
        f"{cfg.num_encoder_layers}+{cfg.num_decoder_layers}, heads {cfg.num_heads}, "
        f"d_ff {cfg.d_ff}, vocab {cfg.vocab_size}), batch {args.batch}, "
        f"source length {args.source_len}, device {jax.devices()[0].device_kind} "
        f"({os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} at start)")
  if args.num_kv_heads:
    if args.family != "encoder_decoder":
      parser.error("--num_kv_heads compares the encoder-decoder's beam search")
    print(format_kv_table(kv_heads_benchmark(cfg, args.num_kv_heads, args.batch, args.lengths[0],
                                             args.beam, args.repeats, args.source_len)))
    return
  if args.weights_dtypes:
    if args.family != "encoder_decoder":
      parser.error("--weights_dtypes compares the encoder-decoder's decoding")
    print(format_weights_table(weights_benchmark(cfg, args.weights_dtypes, args.batch,
                                                 args.lengths[0], args.beam, args.repeats,
                                                 args.source_len)))
    return
  rows = decode_benchmark(cfg, args.batch, tuple(args.lengths), args.beam, args.repeats,
                          args.source_len, args.max_seconds)
  print(format_table(rows))
  by = {(r["method"], r["cached"], r["length"]): r for r in rows}
  for method in dict.fromkeys(r["method"] for r in rows):
    for length in args.lengths:
      speedup = by[(method, False, length)]["seconds"] / by[(method, True, length)]["seconds"]
      print(f"cache speed-up {method} length {length}: {speedup:.1f}x")


if __name__ == "__main__":
  main()
