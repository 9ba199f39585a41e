"""The training loop: the one place that joins data, step, parallelism, checkpoints and metrics.

Checkpoints (txf/checkpoint.py) are written every ``config.checkpoint_every`` steps, at the end,
at every evaluation when ``config.best_metric`` is set (so the best one can be kept), and when the
run is stopped by SIGTERM/SIGINT; saving is asynchronous. A run restarted in the same workdir
resumes from the latest checkpoint (state, data position and the partial log window), so its
metrics.jsonl and final parameters equal those of an uninterrupted run. The dropout RNG of step n
is ``fold_in(split(key(seed))[1], n)``: the step determines it.

Signals: the first SIGTERM or SIGINT finishes the current step, writes a checkpoint and returns
(``txf train`` exits 0); a second one exits at once with status 128 + signal number.

Time limit: ``config.time_limit_minutes > 0`` ends training once the run has trained that long in
all (compilation and in-loop evaluations included): the step reached is treated as the last one
(final evaluation, checkpoint, params.msgpack, plots). The time is counted across restarts: each
checkpoint records the training seconds behind it, so a run stopped and resumed (preemption, a
signal) gets what is left of its budget, not a new one; the time between the last checkpoint and a
kill is not counted, as its steps are trained again. To train on after the limit, raise
``time_limit_minutes`` (it may change on resume).

Non-finite losses: ``train_step`` leaves the state unchanged on such a step; with
``nan_policy='stop'`` the loop raises NonFiniteLossError naming the step before any later state
is saved, with ``'skip'`` it carries on and counts the step in the ``skipped`` metric.
Test hook: ``TXF_INJECT_NAN_AT_STEP=k`` feeds step k (the k-th optimizer step, 1-based as in
metrics.jsonl) NaN parameters, so its loss and gradients are NaN, and then puts the good state
back, as train_step itself does on a non-finite step (same compiled step, no other effect).
"""

import os
import signal
import threading
import time
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from txf import config as config_lib
from txf import workdir as workdir_lib
from txf.checkpoint import Checkpointer
from txf.data import make_task
from txf.errors import TxfError
from txf.metrics import MetricWriter
from txf.models import count_params, init_params, param_axes
from txf.parallel import make_runner
from txf.train import evaluate
from txf.train.optimizer import make_optimizer, make_schedule
from txf.train.steps import create_train_state, make_eval_step, make_train_step, model_config_from


class NonFiniteLossError(TxfError, RuntimeError):
  """A NaN or Inf loss with nan_policy='stop'."""


def _mean_metrics(rows: List[Dict[str, np.ndarray]]) -> Dict[str, float]:
  """Means over the finite steps of a log window (all NaN if none was finite); tokens summed."""
  keys = [k for k in rows[0] if k not in ("finite", "tokens")]
  good = [r for r in rows if float(r["finite"]) != 0.0]
  out = {k: float(np.mean([r[k] for r in good])) if good else float("nan") for k in keys}
  out["tokens"] = float(np.sum([r["tokens"] for r in rows]))
  return out


def _pack_rows(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
  """Per-step metric rows -> JSON (value, dtype and shape kept, so unpacking is exact)."""
  return [{k: [np.asarray(v).tolist(), str(np.asarray(v).dtype)] for k, v in r.items()}
          for r in jax.device_get(rows)]


def _unpack_rows(packed: List[Dict[str, Any]]) -> List[Dict[str, np.ndarray]]:
  return [{k: np.asarray(v, dtype) for k, (v, dtype) in r.items()} for r in packed]


class _Preemption:
  """SIGTERM/SIGINT handling while training (main thread only; elsewhere a no-op).

  The first signal sets ``requested``: the loop finishes its step, checkpoints and stops. A
  second signal exits the process at once with status 128 + signum (no checkpoint; a save in
  flight is left incomplete, which orbax never mistakes for a checkpoint).
  """
  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signum, self._previous = None, {}

  @property
  def signal_name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else ""

  def _handle(self, signum, frame):
    if self.signum is not None:
      os.write(2, f"\ntxf: second {signal.Signals(signum).name}: exiting now\n".encode())
      os._exit(128 + signum)
    self.signum = signum
    os.write(2, f"\ntxf: {signal.Signals(signum).name} received: finishing this step and writing "
                f"a checkpoint (send it again to exit at once)\n".encode())

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in self.SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    return False

  def requested(self, done: int, log_every: int) -> bool:
    """Whether to stop after step ``done``; all processes agree (checked at log steps if several)."""
    return _any_process(lambda: self.signum is not None, done, log_every)


def _any_process(flag: Callable[[], bool], done: int, log_every: int) -> bool:
  """``flag()`` of this process alone, or with several processes, whether any process's flag is
  set; they compare only at log steps (one allgather per ``log_every`` steps), so all agree."""
  if jax.process_count() == 1:
    return flag()
  if done % log_every:
    return False
  from jax.experimental import multihost_utils
  return bool(np.max(multihost_utils.process_allgather(np.int32(flag()))))


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


def _restore_target(runner, abstract_state):
  """What a checkpoint is restored onto, whatever the device count it was written with: straight
  onto the runner's shardings if it has them (mesh: ``state_shardings``), else host numpy arrays
  (``ShapeDtypeStruct`` leaves without a sharding) that ``place_state`` then copies to devices."""
  shardings_of = getattr(runner, "state_shardings", None)
  if shardings_of is None:
    return abstract_state
  return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                                abstract_state, shardings_of(abstract_state))


def _out_of_time(deadline, done: int, log_every: int) -> bool:
  """Whether the time limit has passed after step ``done``; all processes agree (checked at log
  steps if several, like a signal)."""
  if deadline is None:
    return False
  return _any_process(lambda: time.time() >= deadline, done, log_every)


def _train_steps(config, runner, state, train_it, dropout_rng, start_step: int, pending: List,
                 checkpointer: Checkpointer, writer: MetricWriter, bar, preemption: _Preemption,
                 evaluate_at: Callable, deadline=None,
                 trained_seconds: Callable[[], float] = lambda: 0.0) -> tuple:
  """Steps ``start_step+1 .. num_train_steps`` with logging, evaluation and checkpoints.

  ``pending``: metric rows of the current log window (restored on resume). ``deadline``: a
  ``time.time()`` after which the step reached is treated as the last (None = no limit);
  ``trained_seconds()``: the run's training time so far, saved with each checkpoint. Returns
  ``(state, latest eval metrics, step it stopped at on a signal or None, step it ended at on the
  time limit or None)``.
  """
  final, previous, last_log = {}, None, time.time()
  nan_at = int(os.environ.get("TXF_INJECT_NAN_AT_STEP") or 0)  # test hook, see the module doc

  def check(entry):  # entry: (1-based step, its metrics)
    if entry is not None and config.nan_policy == "stop" and float(entry[1]["finite"]) == 0.0:
      kept = checkpointer.latest_step()
      raise NonFiniteLossError(
          f"non-finite loss or gradient at step {entry[0]}: the run stopped; "
          + (f"its last good checkpoint (step {kept}) is kept" if kept is not None else
             "no checkpoint was written") +
          "; lower the learning rate, check the data, or set nan_policy='skip' to skip such batches")

  for step in range(start_step, config.num_train_steps):
    done = step + 1
    batch = next(train_it)
    if done == nan_at:  # NaN parameters in, the good state back after (the step donates its input)
      good = jax.tree_util.tree_map(jnp.copy, state)
      state = state.replace(params=jax.tree_util.tree_map(lambda p: p * jnp.nan, state.params))
    state, metrics = runner.train_step(state, batch, jax.random.fold_in(dropout_rng, step))
    if done == nan_at:
      state = state.replace(params=good.params, opt_state=good.opt_state)
    check(previous)  # the step before: the host never waits on the current one
    previous = (done, metrics)
    pending.append(metrics)
    if bar is not None:
      bar.update(1)
    timed_out = done < config.num_train_steps and _out_of_time(deadline, done, config.log_every)
    is_last = done == config.num_train_steps or timed_out
    if done % config.log_every == 0 or is_last:
      rows = jax.device_get(pending)
      m = _mean_metrics(rows)
      now = time.time()
      m["tokens_per_second"] = m.pop("tokens") / max(now - last_log, 1e-9)
      m["skipped"] = float(sum(1.0 - r["finite"] for r in rows))
      writer.write(done, "train", m)
      if bar is not None:
        bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['accuracy']:.3f}")
      pending, last_log = [], now
    eval_metrics = None
    if (config.eval_every and done % config.eval_every == 0) or is_last:
      if bar is not None:
        bar.clear()
      eval_metrics = final = evaluate_at(state, done)
      last_log = time.time()
    stop = not is_last and preemption.requested(done, config.log_every)
    if (stop or is_last or (config.checkpoint_every and done % config.checkpoint_every == 0)
        or (config.best_metric and eval_metrics is not None)):
      check(previous)  # never save a state that follows a non-finite step
      checkpointer.save(done, runner.host_state(state), train_it.get_state(), eval_metrics,
                        {"pending": _pack_rows(pending), "train_seconds": trained_seconds()})
    if stop:
      return state, final, done, None
    if timed_out:
      check(previous)
      return state, final, None, done
  check(previous)
  return state, final, None, None


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
  schedule = make_schedule(config.optimizer, model_cfg.d_model, config.num_train_steps)
  tx = make_optimizer(config.optimizer, model_cfg.d_model, config.num_train_steps)
  new_state = lambda: create_train_state(init_params(model_cfg, init_rng, example_batch), tx)
  abstract_state = jax.eval_shape(new_state)  # shapes only: a resumed run never initialises
  say(f"txf: {model_cfg.family}, {count_params(abstract_state.params):,} parameters, "
      f"data {config.data.source}, "
      f"{config.num_train_steps} steps of {config.batch_size} on {jax.device_count()} "
      f"{jax.devices()[0].platform} device(s) -> {workdir}")

  runner = make_runner(
      config,
      lambda axis: make_train_step(model_cfg, tx, config.optimizer.label_smoothing, schedule, axis,
                                   config.grad_accum_steps),
      lambda axis: make_eval_step(model_cfg, config.optimizer.label_smoothing, axis),
      param_axes(model_cfg, example_batch))
  train_it = task.train_iterator(config.batch_size, config.seed, jax.process_index(), jax.process_count())

  checkpointer = Checkpointer(workdir, config)
  start_step, pending = 0, []
  restored = (checkpointer.restore_latest(_restore_target(runner, abstract_state))
              if resumed and checkpointer.all_steps() else None)
  if restored is not None:
    state, start_step = restored.state, restored.step
    train_it.set_state(restored.data_state)
    pending = _unpack_rows(restored.loop_state.get("pending", []))
    say(f"resumed from the checkpoint at step {start_step}")
  else:
    state = new_state()
  state = runner.place_state(state)

  writer = MetricWriter(workdir, enabled=is_main)
  writer.truncate_after(start_step)
  eval_batches = task.eval_batches(config.data.eval_split, config.batch_size,
                                   config.eval_batches * config.batch_size or None)
  examples = (task.examples(config.data.eval_split, config.decode_examples)
              if config.decode_examples and model_cfg.family == "encoder_decoder" else [])

  bar = None
  if progress and is_main:
    from tqdm import tqdm
    bar = tqdm(total=config.num_train_steps, initial=start_step, dynamic_ncols=True, desc="train")
  def evaluate_at(st, done):
    metrics = run_eval(runner, st, task, config, model_cfg, eval_batches, examples, writer, done,
                       is_main, say)
    say(f"eval at step {done}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics

  final, stopped_at, timed_out_at = (restored.eval_metrics if restored else {}), None, None
  limit = float(config.get("time_limit_minutes", 0.0))
  used = float(restored.loop_state.get("train_seconds", 0.0)) if restored else 0.0
  started = time.time()
  trained_seconds = lambda: used + time.time() - started
  deadline = started + 60.0 * limit - used if limit > 0 else None
  spent = deadline is not None and used >= 60.0 * limit and start_step < config.num_train_steps
  if spent:
    say(f"txf: the run has already trained {used / 60:.1f} min, its whole time limit of {limit:g} "
        f"min (step {start_step} of {config.num_train_steps}); raise time_limit_minutes to train on")
  with _Preemption() as preemption:
    try:
      if not spent:
        state, evaluated, stopped_at, timed_out_at = _train_steps(
            config, runner, state, train_it, dropout_rng, start_step, pending, checkpointer, writer,
            bar, preemption, evaluate_at, deadline, trained_seconds)
        final = evaluated or final
    finally:
      checkpointer.close()  # waits for the save in flight: it holds a state checked to be finite
      if bar is not None:
        bar.close()
  if stopped_at is not None:
    writer.close()
    say(f"txf: stopped by {preemption.signal_name} after step {stopped_at}; checkpoint written to "
        f"{checkpointer.step_dir(stopped_at)}. Run the same command to resume.")
    return final
  if timed_out_at is not None:
    say(f"txf: time limit of {limit:g} min reached: training ended after step {timed_out_at} of "
        f"{config.num_train_steps} (evaluated, checkpointed, params saved; raise "
        f"time_limit_minutes and run again to go on)")
  if start_step >= config.num_train_steps:
    say(f"the run in {workdir} is already complete ({config.num_train_steps} steps)")
  params = runner.host_params(state)  # every process: a mesh runner gathers shards collectively
  if is_main:
    workdir_lib.save_params(workdir, params)
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
