"""Size a job before launching it: compile (never run) its init and train step on a device mesh.

``plan(config, vocab_size)`` builds the model and optimizer of an experiment config, takes the train
state as ``jax.ShapeDtypeStruct``s in the shardings the mesh would give it (the model's declared
axes + ``config.sharding_rules``), lowers and compiles the born-sharded init and the train step
(``jit(...).lower(...).compile()``) and reads, per device: parameter and optimizer-state bytes
(from the shard shapes), XLA's memory analysis of the compiled step (arguments, temporaries,
peak) and the model FLOPs per step (``txf.models.flops.model_train_flops``, matmuls only). Nothing is
allocated on a device and nothing executes. With a device's peak FLOP/s and an assumed MFU it
estimates the step time, tokens/s and the time to ``num_train_steps``.

The batch is the data's largest fixed shape: ``batch_size`` rows of ``max_input_len`` /
``max_target_len`` tokens, or with ``data.tokens_per_batch`` the longest bucket
(``tokens_per_batch // max_target_len`` rows, rounded down to ``data.rows_multiple``).
"""

import dataclasses
import time
from typing import Any, Dict, List, Optional, Sequence

import jax
import numpy as np

from txf.core import families
from txf.ops.feedforward import ACTIVATIONS, is_gated
from txf.data.pipeline import rows_for_tokens
from txf.models.flops import model_train_flops
from txf.models import init_params, model_config_for, param_axes
from txf.kernels import resolve_impl
from txf.nn import mup
from txf.nn.config import resolve_dtype
from txf.parallel import sharding as sharding_lib
from txf.parallel.mesh_runner import MeshRunner
from txf.train.optimizer import make_optimizer, make_schedule
from txf.train.steps import create_train_state, make_eval_step, make_train_step
from txf.core.config import ConfigError, resolve_vocab_multiple


def batch_shape(config) -> Dict[str, int]:
  """{"rows", "source_len", "target_len", "encoder_len"} of the largest batch the data gives one
  step: its rows from the data's own count (``txf.data.pipeline.rows_for_tokens``) for
  ``max_target_len``. ``encoder_len`` is what the encoder reads: ``source_len``, except for a
  family whose loss rewrites the batch (``txf.core.families.Family.lengths``): its rows are windows of
  L = ``max_input_len`` tokens, and the model reads the lengths the family gives, whatever
  ``data.max_target_len`` says (span corruption: encoder inputs of L - n + s + 1 and targets of
  n + s + 1 tokens, n noise tokens in s spans, ``txf.core.objectives.corrupted_lengths``)."""
  d = config.data
  source, target = d.max_input_len, d.max_target_len
  encoder, window = source, target  # window: the length the data's rows are counted for
  lengths = families.get(config.model.family).lengths
  if lengths is not None:
    encoder, target = families.resolve(lengths)(source, config.pretrain)
    window = source
  rows = rows_for_tokens(config.batch_size, d.tokens_per_batch, d.rows_multiple, window)
  return {"rows": rows, "source_len": source, "target_len": target, "encoder_len": encoder}


def _bytes_per_device(abstract_sharded) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard each)."""
  return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                 for x in jax.tree_util.tree_leaves(abstract_sharded)))


def host_of_devices(devices, hosts: int = 0) -> List[int]:
  """The host (process) of each device: its ``process_index`` when the devices span several
  processes (a TPU topology, a multi-process job), else ``hosts`` contiguous groups of the
  devices as listed (fake CPU devices standing in for ``hosts`` hosts; 0 or 1 = one host)."""
  indices = [getattr(d, "process_index", 0) for d in devices]
  if len(set(indices)) > 1 or hosts <= 1:
    return indices
  if len(devices) % hosts:
    raise ConfigError(f"--hosts={hosts} does not divide the {len(devices)} devices: give a "
                      f"divisor of {len(devices)}")
  per = len(devices) // hosts
  return [i // per for i in range(len(devices))]


def bytes_per_host(abstract_sharded, devices, host_of: Sequence[int]) -> List[int]:
  """Bytes of the distinct shards each host's devices hold of a tree of sharded
  ShapeDtypeStructs: sum over leaves of |{index of the shard on d : d on host h}| shard sizes
  (a shard replicated on two devices of one host counts once, as it is written once)."""
  where = {d: h for d, h in zip(devices, host_of)}
  totals = [0] * (max(host_of) + 1)
  for x in jax.tree_util.tree_leaves(abstract_sharded):
    seen = [set() for _ in totals]
    for device, index in x.sharding.devices_indices_map(x.shape).items():
      h = where.get(device)
      key = tuple((sl.start, sl.stop) for sl in index)
      if h is None or key in seen[h]:
        continue
      seen[h].add(key)
      sizes = [len(range(*sl.indices(n))) for sl, n in zip(index, x.shape)]
      totals[h] += int(np.prod(sizes, dtype=np.int64)) * x.dtype.itemsize
  return totals


def largest_arrays(params) -> Dict[str, Any]:
  """{"array": (name, bytes)} of the largest single parameter and {"layer": (name, bytes)} of
  the largest layer (a top-level entry of an encoder or decoder stack, or any other top-level
  module such as the embedding), from a tree of ShapeDtypeStructs."""
  def nbytes(tree):
    return int(sum(np.prod(x.shape, dtype=np.int64) * x.dtype.itemsize
                   for x in jax.tree_util.tree_leaves(tree)))
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  name, leaf = max(flat, key=lambda kv: np.prod(kv[1].shape, dtype=np.int64) * kv[1].dtype.itemsize)
  array = ("/".join(str(getattr(k, "key", k)) for k in name), nbytes(leaf))
  layers = []
  for top, sub in params.items():
    if isinstance(sub, dict) and any(isinstance(v, dict) and "layer" in k for k, v in sub.items()):
      layers += [(f"{top}/{k}", nbytes(v)) for k, v in sub.items() if isinstance(v, dict)]
    else:
      layers.append((str(top), nbytes(sub)))
  return {"array": array, "layer": max(layers, key=lambda kv: kv[1])}


def _memory(compiled) -> Dict[str, int]:
  m = compiled.memory_analysis()
  if m is None:
    return {}
  out = {"argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
         "alias_bytes": m.alias_size_in_bytes, "temp_bytes": m.temp_size_in_bytes}
  # arguments + outputs not aliased to (donated) arguments + temporaries: all live at the peak, at most
  bound = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
           + m.temp_size_in_bytes)
  out["peak_bytes"] = int(max(getattr(m, "peak_memory_in_bytes", 0) or 0, bound))
  return {k: int(v) for k, v in out.items()}


def _xla_flops(compiled) -> Optional[float]:
  """FLOPs of one device's compiled program by XLA's cost analysis (None where not reported)."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except  # not every backend implements it
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = (cost or {}).get("flops")
  return float(flops) if flops is not None and flops >= 0 else None


def plan(config, vocab_size: int, devices=None, device_peak_tflops: float = 0.0,
         mfu: float = 0.4, hbm_bytes: int = 0, hosts: int = 0) -> Dict:
  """Compile ``config``'s init and train step on a mesh over ``devices`` (default: all) and return
  the per-device figures (see the module docstring) and the per-host ones: the bytes of the state
  shards each host's devices hold (what the host writes to a checkpoint or to the sharded final
  ``params/``), the largest single parameter array and the largest layer. ``hosts`` splits
  devices of one process into that many hosts (fake CPU devices). Raises ConfigError for a mesh
  that does not fit the devices or does not divide the model."""
  devices = list(jax.devices() if devices is None else devices)
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1 and not tuple(config.dcn_mesh_shape or ()):
    config = config.copy_and_resolve_references()
    config.dcn_mesh_shape = (slices, 1, 1)   # multislice: data parallel across the slices
  mesh_shape = tuple(config.mesh_shape) if config.parallelism == "mesh" else (-1, 1, 1)
  mesh = sharding_lib.make_mesh(mesh_shape, devices, config.dcn_mesh_shape)
  rules = dict(config.sharding_rules.items())
  platform = devices[0].platform
  # "auto" choices as on the devices planned for (a TPU topology compiled from a CPU host)
  cfg = model_config_for(config, vocab_size, vocab_multiple=resolve_vocab_multiple(
      config, len(devices), platform, len({d.process_index for d in devices})))
  cfg = dataclasses.replace(cfg, dtype=resolve_dtype(cfg.dtype, platform),
                            attention_impl=resolve_impl(cfg.attention_impl, platform))
  shape = batch_shape(config)
  rows, s, t = shape["rows"], shape["source_len"], shape["target_len"]
  ways = int(np.prod([mesh.shape[a] for a in sharding_lib.MESH_AXES
                      if a in sharding_lib.parse_rules(rules)["batch"]]))
  if rows % ways:
    raise ConfigError(f"a batch of {rows} rows does not split over the {ways} batch shards of mesh "
                      f"{dict(mesh.shape)}: make batch_size (or tokens_per_batch / max_target_len) a "
                      f"multiple of {ways}")
  example = {"inputs": np.zeros((rows, s), np.int32), "targets": np.zeros((rows, t), np.int32)}
  if families.get(cfg.family).predicts == "label":
    example["label"] = np.zeros((rows,), np.int32)
  tx = make_optimizer(config.optimizer, mup.schedule_width(cfg), config.num_train_steps, cfg)
  schedule = make_schedule(config.optimizer, mup.schedule_width(cfg), config.num_train_steps)
  axes = param_axes(cfg, example)
  init = lambda rng: create_train_state(init_params(cfg, rng, example), tx)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  abstract = jax.eval_shape(init, key)
  target = sharding_lib.abstract_sharded(abstract, mesh, rules, axes)
  shardings = jax.tree_util.tree_map(lambda x: x.sharding, target)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  with sharding_lib.step_context(mesh, rules):
    init_compiled = jax.jit(init, in_shardings=replicated, out_shardings=shardings).lower(key).compile()
  runner = MeshRunner(make_train_step(cfg, tx, config.optimizer.label_smoothing, schedule, None,
                                      config.grad_accum_steps),
                      make_eval_step(cfg, config.optimizer.label_smoothing), mesh, rules, axes)
  start = time.perf_counter()
  step_compiled = runner.lower_train(target, example).compile()
  compile_seconds = time.perf_counter() - start

  param_total = int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(abstract.params)))
  flops = model_train_flops(cfg, rows, shape["encoder_len"], t)
  n = len(devices)
  out = {"devices": n, "mesh_shape": [int(mesh.shape[a]) for a in sharding_lib.MESH_AXES],
         "mesh_axes": list(sharding_lib.MESH_AXES), "platform": devices[0].platform,
         "model": {k: getattr(cfg, k) for k in ("family", "d_model", "num_heads", "num_kv_heads",
                                                "d_ff", "ffn_hidden", "activation",
                                                "num_encoder_layers", "num_decoder_layers",
                                                "vocab_size", "dtype", "remat", "scan_layers")},
         "batch": shape,
         "params": int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(abstract.params))),
         "param_bytes_total": param_total,
         "param_bytes_per_device": _bytes_per_device(target.params),
         "opt_bytes_per_device": _bytes_per_device(target.opt_state),
         "flops_per_step": flops, "tokens_per_step": rows * t,
         "num_train_steps": int(config.num_train_steps),
         "step_compile_seconds": compile_seconds}
  host_of = host_of_devices(devices, hosts)
  per_host_params = bytes_per_host(target.params, devices, host_of)
  per_host_opt = bytes_per_host(target.opt_state, devices, host_of)
  largest = largest_arrays(abstract.params)
  out["hosts"] = {"count": max(host_of) + 1, "devices_per_host": n // (max(host_of) + 1),
                  "param_bytes": max(per_host_params), "opt_bytes": max(per_host_opt),
                  "state_bytes": max(p + o for p, o in zip(per_host_params, per_host_opt)),
                  "largest_array": largest["array"][0], "largest_array_bytes": largest["array"][1],
                  "largest_layer": largest["layer"][0], "largest_layer_bytes": largest["layer"][1]}
  step_mem, init_mem = _memory(step_compiled), _memory(init_compiled)
  out["temp_bytes_per_device"] = step_mem.get("temp_bytes")
  out["peak_bytes_per_device"] = step_mem.get("peak_bytes")
  out["init_peak_bytes_per_device"] = init_mem.get("peak_bytes")
  out["step_memory"] = step_mem
  out["xla_flops_per_device"] = _xla_flops(step_compiled)
  if hbm_bytes:
    out["hbm_bytes_per_device"] = int(hbm_bytes)
    out["fits"] = bool(out["peak_bytes_per_device"] is not None and out["peak_bytes_per_device"] <= hbm_bytes)
  if device_peak_tflops > 0:
    step_s = flops / (n * device_peak_tflops * 1e12 * mfu)
    out.update(device_peak_tflops=device_peak_tflops, mfu=mfu, step_seconds=step_s,
               tokens_per_second=rows * t / step_s, train_hours=step_s * config.num_train_steps / 3600)
  return out


def _size(b: Optional[float]) -> str:
  if b is None:
    return "n/a"
  for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if b >= scale:
      return f"{b / scale:.2f} {unit}"
  return f"{int(b)} B"


def _host_lines(p: Dict) -> List[str]:
  """The per-host block of ``format_plan`` (plans written before it had none: no lines)."""
  h = p.get("hosts")
  if not h:
    return []
  return [f"per host ({h['count']} host{'s' if h['count'] > 1 else ''} x {h['devices_per_host']} "
          f"devices), the most any host holds:",
          f"  state shards      {_size(h['state_bytes']):>12}   (parameters {_size(h['param_bytes'])} "
          f"+ Adam {_size(h['opt_bytes'])}: a checkpoint's or the final params/' share)",
          f"  largest array     {_size(h['largest_array_bytes']):>12}   ({h['largest_array']}: what "
          f"average-checkpoints reads at once)",
          f"  largest layer     {_size(h['largest_layer_bytes']):>12}   ({h['largest_layer']})"]


def _ffn_words(m: Dict) -> str:
  """'d_ff 2048', or the effective hidden size of a gated FFN: 'd_ff 1368 (swiglu, matched to
  d_ff 2048)' (a plan written before ffn_hidden was recorded: its d_ff)."""
  hidden, act = m.get("ffn_hidden", m["d_ff"]), m.get("activation", "")
  notes = ([act] if act in ACTIVATIONS and is_gated(act) else []) + (
      [f"matched to d_ff {m['d_ff']}"] if hidden != m["d_ff"] else [])
  return f"d_ff {hidden}" + (f" ({', '.join(notes)})" if notes else "")


def _kv_heads_note(m: Dict) -> str:
  """", h query / h_kv key-value heads" for grouped-query attention (nothing for plain heads)."""
  h, hk = m["num_heads"], m.get("num_kv_heads") or m["num_heads"]
  return "" if hk == h else f", {h} query / {hk} key-value heads"


def format_plan(p: Dict) -> str:
  """The plan as the lines ``txf plan`` prints."""
  m, b = p["model"], p["batch"]
  mesh = " x ".join(f"{a}={s}" for a, s in zip(p["mesh_axes"], p["mesh_shape"]))
  lines = [f"model      {m['family']}, {p['params'] / 1e6:.1f}M parameters (d_model {m['d_model']}, "
           f"{m['num_encoder_layers']}+{m['num_decoder_layers']} layers, {_ffn_words(m)}, "
           f"V {m['vocab_size']}, {m['dtype']} compute, remat {m['remat']}"
           f"{_kv_heads_note(m)}"
           f"{', scanned layers' if m['scan_layers'] else ''})",
           f"mesh       {p['devices']} {p['platform']} devices: {mesh}",
           f"batch      {b['rows']} rows x {b['source_len']} / {b['target_len']} tokens "
           f"({p['tokens_per_step']} target tokens per step)",
           "per device:",
           f"  parameters        {_size(p['param_bytes_per_device']):>12}   "
           f"(of {_size(p['param_bytes_total'])} in all)",
           f"  optimizer state   {_size(p['opt_bytes_per_device']):>12}",
           f"  temporaries       {_size(p['temp_bytes_per_device']):>12}   (XLA, compiled train step)",
           f"  peak              {_size(p['peak_bytes_per_device']):>12}   (train step; init "
           f"{_size(p['init_peak_bytes_per_device'])})",
           *_host_lines(p),
           f"compile    train step in {p['step_compile_seconds']:.1f} s (lowering + XLA)",
           f"model FLOPs per step  {p['flops_per_step'] / 1e12:.2f} TFLOP (matmuls, forward + backward)"]
  if p.get("xla_flops_per_device"):
    lines.append(f"XLA FLOPs per step   {p['xla_flops_per_device'] / 1e12:.2f} TFLOP per device "
                 f"(compiled program, all ops)")
  if "hbm_bytes_per_device" in p:
    share = (p["peak_bytes_per_device"] or 0) / p["hbm_bytes_per_device"]
    lines.append(f"HBM        {_size(p['hbm_bytes_per_device'])} per chip: "
                 f"{'fits' if p['fits'] else 'DOES NOT FIT'} (peak {100 * share:.0f}% of it)")
  if "step_seconds" in p:
    lines.append(f"at {p['device_peak_tflops']:g} TFLOP/s peak per device and {100 * p['mfu']:.0f}% MFU: "
                 f"{p['step_seconds'] * 1e3:.1f} ms/step, {p['tokens_per_second']:,.0f} tokens/s, "
                 f"{p['num_train_steps']} steps in {p['train_hours']:.1f} h")
  return "\n".join(lines)
