"""The training loop: the one place that joins data, step, parallelism, checkpoints and metrics."""

import os
import time
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from txf import config as config_lib
from txf import workdir as workdir_lib
from txf.data import make_task
from txf.metrics import MetricWriter
from txf.models import count_params, init_params
from txf.parallel import make_runner
from txf.train import evaluate
from txf.train.optimizer import make_optimizer, make_schedule
from txf.train.steps import create_train_state, make_eval_step, make_train_step, model_config_from


class NonFiniteLossError(RuntimeError):
  """A NaN or Inf loss with nan_policy='stop'."""


def _mean_metrics(rows: List[Dict[str, np.ndarray]]) -> Dict[str, float]:
  keys = [k for k in rows[0] if k not in ("finite", "tokens")]
  out = {k: float(np.mean([r[k] for r in rows])) for k in keys}
  out["tokens"] = float(np.sum([r["tokens"] for r in rows]))
  return out


def run_eval(runner, state, task, config, model_cfg, eval_batches, examples, writer, step,
             is_main: bool, say=print) -> Dict[str, float]:
  """Loss/accuracy on the eval split; for translation also decode held-out examples."""
  sums = None
  for batch in eval_batches:
    s = runner.eval_step(state, batch)
    sums = s if sums is None else jax.tree_util.tree_map(jnp.add, sums, s)
  metrics = evaluate.summarize(jax.device_get(sums), model_cfg.family) if sums is not None else {}
  if model_cfg.family == "encoder_decoder" and examples:
    params = runner.host_params(state)
    hyps = evaluate.decode_examples(model_cfg, params, task, examples, config.decode_max_extra,
                                    beam_size=config.beam_size, alpha=config.alpha)
    refs = [e.reference for e in examples]
    metrics["exact_match"] = evaluate.exact_match(hyps, refs)
    try:
      import sacrebleu
      metrics["bleu"] = float(sacrebleu.corpus_bleu(hyps, [refs]).score)
    except Exception:  # pragma: no cover - sacrebleu is a dependency
      pass
    if is_main and config.num_samples:
      say(f"  samples at step {step}:")
      for e, h in list(zip(examples, hyps))[: config.num_samples]:
        mark = "ok " if " ".join(h.split()) == " ".join(e.reference.split()) else "   "
        say(f"  {mark}src: {e.source}\n     ref: {e.reference}\n     hyp: {h}")
  if writer is not None:
    writer.write(step, "eval", metrics)
  return metrics


def train(config, workdir: str, fresh: bool = False, progress: bool = True) -> Dict[str, float]:
  """Train ``config`` in ``workdir``; returns the final evaluation metrics.

  Validates the config first; refuses a workdir that holds a different run (``fresh`` moves it
  aside). Writes config.json, task.json, tokenizer/, metrics.jsonl, tensorboard/, params.msgpack.
  """
  config_lib.validate(config)
  is_main = jax.process_index() == 0
  say = print if is_main else (lambda *a, **k: None)
  resumed = workdir_lib.prepare(workdir, config, fresh) if is_main else True

  task = make_task(config, workdir)
  config_lib.validate(config, {"max_input_len": task.max_input_len,
                               "max_target_len": task.max_target_len})
  model_cfg = model_config_from(config, task)
  if is_main:
    task.save(os.path.join(workdir, "tokenizer"))
    workdir_lib.write_json(os.path.join(workdir, "task.json"), task.describe())

  rng = jax.random.key(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  example_batch = next(task.train_iterator(config.batch_size, config.seed))
  params = init_params(model_cfg, init_rng, example_batch)
  schedule = make_schedule(config.optimizer, model_cfg.d_model)
  tx = make_optimizer(config.optimizer, model_cfg.d_model)
  state = create_train_state(params, tx)
  say(f"txf: {model_cfg.family}, {count_params(params):,} parameters, data {config.data.source}, "
      f"{config.num_train_steps} steps of {config.batch_size} on {jax.device_count()} "
      f"{jax.devices()[0].platform} device(s) -> {workdir}")

  runner = make_runner(
      config,
      lambda axis: make_train_step(model_cfg, tx, config.optimizer.label_smoothing, schedule, axis,
                                   config.grad_accum_steps),
      lambda axis: make_eval_step(model_cfg, config.optimizer.label_smoothing, axis))
  train_it = task.train_iterator(config.batch_size, config.seed, jax.process_index(), jax.process_count())

  start_step = 0
  checkpointer = None
  try:
    from txf.checkpoint import Checkpointer
    checkpointer = Checkpointer(workdir, config)
    restored = checkpointer.restore_latest(state) if resumed else None
    if restored is not None:
      state, data_state, start_step = restored
      train_it.set_state(data_state)
      say(f"resumed from the checkpoint at step {start_step}")
  except ImportError:
    pass
  state = runner.place_state(state)

  writer = MetricWriter(workdir, enabled=is_main)
  writer.truncate_after(start_step)
  eval_batches = task.eval_batches(config.data.eval_split, config.batch_size,
                                   config.eval_batches * config.batch_size or None)
  examples = (task.examples(config.data.eval_split, config.decode_examples)
              if config.decode_examples and model_cfg.family == "encoder_decoder" else [])

  pending, last_log = [], time.time()
  previous = None
  steps = range(start_step, config.num_train_steps)
  bar = None
  if progress and is_main:
    from tqdm import tqdm
    bar = tqdm(total=config.num_train_steps, initial=start_step, dynamic_ncols=True, desc="train")
  final = {}
  for step in steps:
    batch = next(train_it)
    state, metrics = runner.train_step(state, batch, jax.random.fold_in(dropout_rng, step))
    if previous is not None:  # check the step before, so the host never waits on the current one
      prev_step, prev_metrics = previous
      if float(prev_metrics["finite"]) == 0.0 and config.nan_policy == "stop":
        raise NonFiniteLossError(
            f"non-finite loss or gradient at step {prev_step + 1}: the run stopped and its last "
            f"good checkpoint is kept; lower the learning rate, check the data, or set "
            f"nan_policy='skip' to skip such batches")
    previous = (step, metrics)
    pending.append(metrics)
    done = step + 1
    if bar is not None:
      bar.update(1)
    if done % config.log_every == 0 or done == config.num_train_steps:
      rows = jax.device_get(pending)
      m = _mean_metrics(rows)
      now = time.time()
      m["tokens_per_second"] = m.pop("tokens") / max(now - last_log, 1e-9)
      m["skipped"] = float(sum(1.0 - r["finite"] for r in rows))
      writer.write(done, "train", m)
      if bar is not None:
        bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['accuracy']:.3f}")
      pending, last_log = [], now
    is_last = done == config.num_train_steps
    if (config.eval_every and done % config.eval_every == 0) or is_last:
      if bar is not None:
        bar.clear()
      final = run_eval(runner, state, task, config, model_cfg, eval_batches, examples, writer, done,
                       is_main, say)
      say(f"eval at step {done}: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
      last_log = time.time()
    if checkpointer is not None and ((config.checkpoint_every and done % config.checkpoint_every == 0)
                                     or is_last):
      checkpointer.save(done, runner.host_state(state), train_it.get_state(), final if is_last else None)
  if previous is not None and float(previous[1]["finite"]) == 0.0 and config.nan_policy == "stop":
    raise NonFiniteLossError(f"non-finite loss or gradient at step {previous[0] + 1}")
  if bar is not None:
    bar.close()
  if checkpointer is not None:
    checkpointer.close()
  if start_step >= config.num_train_steps:
    say(f"the run in {workdir} is already complete ({config.num_train_steps} steps)")
  if is_main:
    workdir_lib.save_params(workdir, runner.host_params(state))
    _write_plots(workdir, say)
  writer.close()
  return final


def _write_plots(workdir: str, say) -> None:
  try:
    from txf import viz
  except ImportError:
    return
  try:
    paths = viz.write_run_plots(workdir)
    say("plots: " + ", ".join(paths))
  except Exception as e:  # a plotting failure must not lose a finished run
    say(f"warning: could not write plots: {e}")
