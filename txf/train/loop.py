"""The training loop: the one place that joins data, step, parallelism, checkpoints and metrics.

``train`` reads top to bottom as its phases: set up, restore, then per step (step, log, evaluate,
stop?, checkpoint), then finish. Everything one run needs lives in a ``Setup``; what changes from
step to step lives in a ``LoopState``.

Checkpoints (txf/train/checkpoint.py) are written every ``config.checkpoint_every`` steps, at the end,
at every evaluation when ``config.best_metric`` is set (so the best one can be kept), and when the
run is stopped by SIGTERM/SIGINT; saving is asynchronous. A run restarted in the same workdir
resumes from the latest checkpoint (state, data position and the partial log window), so its
metrics.jsonl and final parameters equal those of an uninterrupted run. The dropout RNG of step n
is ``fold_in(split(key(seed))[1], n)``: the step determines it, and the step derives it on
device (``fold_step_into_key``). A step's only host work is feeding the next batch: its metrics
stay on device until the log row (one fetch per ``log_every`` window), when the non-finite and
divergence guards take them too (``check_steps``; also before every checkpoint).

Stopping early (signals, ``time_limit_minutes``, ``nan_policy``): see txf/train/stopping.py. On the
time limit the step reached is treated as the last one (final evaluation, checkpoint,
params.msgpack, plots); to train on, raise ``time_limit_minutes`` (it may change on resume).

A researcher's own loss or model: ``train(config, workdir, loss_fn=..., model=...)`` (see
``txf.models.LossFn`` and ``txf.models.ModelBuilder``); both default to txf's own.
"""

import collections
import dataclasses
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import jax

from txf.core import config as config_lib
from txf.core import families
from txf.core.config import ConfigError
from txf.data import TaskSpec, make_task
from txf.decode import DecodingSpec
from txf.inference import Evaluator, make_eval_step
from txf.models import (LossFn, ModelBuilder, abstract_params, count_params, init_params,
                        model_config_from, param_axes, unpad_vocab)
from txf.nn import mup
from txf.parallel import ParallelSpec, distributed, make_runner
from txf.parallel.feeding import Feed
from txf.parallel.sharding import check_splits
from txf.runtime import compile_cache, program_cache
from txf.runtime import workdir as workdir_lib
from txf.train.checkpoint import Checkpointer, CheckpointSpec
from txf.train.init_from import apply_init_from, initial_params, tokenizer_home, write_report
from txf.train.logs import Eta, LogWindow, unpack_rows
from txf.train.metrics import MetricWriter
from txf.train.optimizer import OptimizerSpec, make_optimizer, make_schedule
from txf.train.profile import StepProfiler
from txf.train.report import Reporter, Silent
from txf.train.samples import lm_prompts, lm_samples
from txf.train.steps import create_train_state, fold_step_into_key, make_train_step, run_keys
from txf.train.stopping import DivergenceGuard, NonFiniteGuard, Preemption, TimeLimit


@dataclasses.dataclass
class Setup:
  """What one run needs, fixed for the whole run."""
  config: Any
  workdir: str
  task: Any
  model_cfg: Any
  runner: Any
  train_it: Any
  checkpointer: Checkpointer
  writer: MetricWriter
  evaluator: Evaluator
  new_state: Callable[[], Any]      # a freshly initialised TrainState
  abstract_state: Any               # its shapes (a resumed run never initialises)
  dropout_rng: jax.Array
  report: Reporter                  # process 0: the caller's reporter; other processes: Silent
  every_process: Reporter           # the caller's reporter, on every process (stop and signals)
  is_main: bool
  resumed: bool                     # the workdir already held this run
  custom_model: bool = False        # model= was given (in-loop sampling needs txf's own model)


@dataclasses.dataclass
class LoopState:
  """What changes from step to step."""
  state: Any                        # the TrainState on the runner's devices
  step: int                         # steps done
  start: int                        # the step this process started from
  window: LogWindow                 # train metrics since the last log row
  guard: NonFiniteGuard
  clock: TimeLimit
  final: Dict[str, float]           # the latest eval metrics
  stopped_by: str = ""              # "signal" or "time" when training ended early
  eta: Optional[Eta] = None         # time left (the one-line log); set at this process's first step
  divergence: Optional[DivergenceGuard] = None  # set at this process's first step
  profiler: Optional[StepProfiler] = None  # config.profile_steps; set at this process's first step
  unchecked: Deque[Tuple[int, Any]] = dataclasses.field(default_factory=collections.deque)
  # (step, metrics on device) not yet given to the guards (``check_steps``)


def batch_phrase(config) -> str:
  """What one step trains on, for the run's header: rows, or a token budget when the rows of each
  batch come from ``data.tokens_per_batch`` (tokens_per_batch // the bucket's length)."""
  tokens = config.data.tokens_per_batch
  if tokens and tokens > 0:
    return f"{tokens:,} tokens (data.tokens_per_batch)"
  return f"{config.batch_size}"


def train(config, workdir: str, fresh: bool = False, *, loss_fn: Optional[LossFn] = None,
          model: Optional[ModelBuilder] = None, report: Optional[Reporter] = None
          ) -> Dict[str, float]:
  """Train ``config`` in ``workdir``; returns the final evaluation metrics.

  Fills the fields ``config`` lacks (``txf.core.config.complete``, in place) and validates it
  first; refuses a workdir that holds a different run (``fresh`` moves it
  aside). Writes config.json, task.json, tokenizer/, metrics.jsonl, tensorboard/, params.msgpack.
  ``loss_fn`` replaces the label-smoothed cross-entropy in training and evaluation;
  ``model(cfg, deterministic=False, decode=False)`` replaces ``txf.models.build_model``.
  ``report`` (a ``txf.train.report.Reporter``) hears the run's lines and progress; the default
  logs the lines on the ``txf.train`` logger and writes nothing to stdout or stderr.
  """
  config = config_lib.complete(config)
  run = set_up(config, workdir, fresh, loss_fn, model, report or Reporter())
  loop = restore(run)
  # held through finish: a late SIGTERM lets it complete
  with Preemption(notify=run.every_process.signal) as preemption:
    try:
      while loop.step < config.num_train_steps and not loop.stopped_by:
        take_step(run, loop)
        is_last = loop.step == config.num_train_steps or loop.stopped_by == "time"
        log(run, loop, is_last)
        evaluated = evaluate(run, loop, is_last)
        if not is_last and preemption.requested():
          loop.stopped_by = "signal"
        checkpoint(run, loop, is_last, evaluated)
      if loop.stopped_by != "signal":
        check_steps(loop)
        loop.guard.check()
    finally:
      with workdir_lib.disk_errors(run.checkpointer.directory, "saving a checkpoint to"):
        run.checkpointer.close()  # waits for the save in flight: it holds a state checked finite
      run.report.close()
      if loop.profiler is not None:
        loop.profiler.close()
    return finish(run, loop, preemption)


def set_up(config, workdir, fresh, loss_fn, model, report: Reporter) -> Setup:
  """Validate, prepare the workdir, build the task, model, optimizer, runner, writer, evaluator.

  Several processes: process 0 alone prepares the workdir (checks it, or moves it aside with
  ``fresh``), then makes the task and writes tokenizer/ and task.json; every other process waits
  at a barrier after each (``distributed.main_first``) and raises process 0's error if it failed.
  A mesh run creates its state born sharded (``runner.init_state``): no device or host holds it all.
  """
  compile_cache.apply(jax.config, config.compile_cache)  # before the first compile
  apply_init_from(config)  # config.init_from: its architecture and tokenizer
  if config.plugins:  # config.json keeps absolute paths: later commands import the same files
    config.plugins = families.absolute_plugins(config.plugins)
  config_lib.validate(config)
  is_main = jax.process_index() == 0
  say = report.line if is_main else Silent().line
  resumed = bool(distributed.main_first(lambda: workdir_lib.prepare(workdir, config, fresh, say),
                                        "the workdir's preparation"))
  made = {}

  def make_and_save():
    made["task"] = _make_task(config, tokenizer_home(config, workdir), model)
    workdir_lib.save_task(workdir, made["task"])
    return 0

  distributed.main_first(make_and_save, "the task's set-up")
  task = made["task"] if is_main else _make_task(config, workdir, model)
  model_cfg = model_config_from(config, task)
  decodes = config.decode_examples and families.get(model_cfg.family).decoding == "seq2seq"
  init_rng, dropout_rng = run_keys(config.seed)
  example_batch = next(task.train_iterator(config.batch_size, config.seed))
  optimizer, layout = OptimizerSpec.from_config(config.optimizer), ParallelSpec.from_config(config)
  width = mup.schedule_width(model_cfg)  # d_model (muP: the base width)
  schedule = make_schedule(optimizer, width, config.num_train_steps)
  tx = make_optimizer(optimizer, width, config.num_train_steps, model_cfg)
  start, loaded = initial_params(  # config.init_from's parameters (merged across objectives), or None
      config, model_cfg, task,
      lambda: jax.device_get(init_params(model_cfg, init_rng, example_batch, model)))
  if loaded is not None and is_main and not resumed:
    say(write_report(workdir, loaded))
  if start is None:
    init_state = lambda: create_train_state(init_params(model_cfg, init_rng, example_batch, model), tx)
  else:
    init_state = lambda: create_train_state(jax.tree_util.tree_map(jax.numpy.asarray, start), tx)
  if start is None:  # one trace of the init gives the state's shapes and the parameters' axes
    shapes, axes = abstract_params(model_cfg, example_batch, model)
    abstract_state = program_cache.cached_eval_shape(lambda p: create_train_state(p, tx), shapes)
  else:
    abstract_state = jax.eval_shape(init_state)
    axes = param_axes(model_cfg, example_batch, model)
  check_splits(layout, abstract_state.params, axes, jax.device_count())  # before any compile
  say(f"txf: {model_cfg.family}, {count_params(abstract_state.params):,} parameters, "
      f"data {config.data.source}, "
      f"{config.num_train_steps} steps of {batch_phrase(config)} on {jax.device_count()} "
      f"{jax.devices()[0].platform} device(s) -> {workdir}")
  smoothing = optimizer.label_smoothing
  runner = make_runner(
      layout,
      lambda axis: fold_step_into_key(make_train_step(  # step n's rng: fold_in(key, n), on device
          model_cfg, tx, smoothing, schedule, axis, config.grad_accum_steps, loss_fn=loss_fn,
          build=model)),
      lambda axis: make_eval_step(model_cfg, smoothing, axis, loss_fn=loss_fn, build=model), axes)
  runner.prefetch(abstract_state, example_batch, dropout_rng)  # loads while the state is made
  born_sharded = getattr(runner, "init_state", None)  # mesh: created in its shardings
  new_state = (lambda: born_sharded(init_state)) if born_sharded else init_state
  train_it = task.train_iterator(config.batch_size, config.seed, jax.process_index(),
                                 jax.process_count(), layout=Feed(runner, config.grad_accum_steps))
  eval_batches = task.eval_batches(config.data.eval_split, config.batch_size,
                                   config.eval_batches * config.batch_size or None)
  examples = task.examples(config.data.eval_split, config.decode_examples) if decodes else []
  evaluator = Evaluator(model_cfg, task, eval_batches, examples, DecodingSpec.from_config(config),
                        bleu_protocol=config.bleu_protocol,
                        lang=config.data.tgt_lang)
  return Setup(config, workdir, task, model_cfg, runner, train_it,
               Checkpointer(workdir, CheckpointSpec.from_config(config), agreed_steps=True),
               MetricWriter(workdir, enabled=is_main, tracker=config.tracker,
                            run_config=workdir_lib.config_to_dict(config)),
               evaluator,
               new_state, abstract_state, dropout_rng, report if is_main else Silent(), report,
               is_main, resumed,
               custom_model=model is not None)


def _make_task(config, workdir, model):
  """The task, with the config checked against its lengths (and a custom model's decoding)."""
  task = make_task(TaskSpec.from_config(config), workdir)
  config_lib.validate(config, {"max_input_len": task.max_input_len,
                               "max_target_len": task.max_target_len})
  family = families.get(model_config_from(config, task).family)
  if model is not None and config.decode_examples and family.decoding == "seq2seq":
    raise ConfigError("a custom model cannot be decoded in-loop (decoding uses txf's own model): "
                      "set config.decode_examples=0")
  return task


def restore(run: Setup) -> LoopState:
  """The loop's starting point: the latest checkpoint of this run (state, data position, log
  window, eval metrics, training time), or a fresh state at step 0."""
  config, checkpointer = run.config, run.checkpointer
  restored = (checkpointer.restore_latest(_restore_target(run.runner, run.abstract_state))
              if run.resumed and checkpointer.all_steps() else None)
  if restored is not None:
    state, step = restored.state, restored.step
    run.train_it.set_state(restored.data_state)
    rows = unpack_rows(restored.loop_state.get("pending", []))
    used, final = float(restored.loop_state.get("train_seconds", 0.0)), restored.eval_metrics
    run.report.line(f"resumed from the checkpoint at step {step}")
  else:
    state, step, rows, used, final = run.new_state(), 0, [], 0.0, {}
  run.writer.truncate_after(step)
  loop = LoopState(run.runner.place_state(state), step, step, LogWindow(rows),
                   NonFiniteGuard(config.nan_policy, checkpointer.latest_step),
                   TimeLimit(config.time_limit_minutes, used), final)
  if loop.clock.spent() and step < config.num_train_steps:
    run.report.line(f"txf: the run has already trained {used / 60:.1f} min, its whole time limit of "
            f"{config.time_limit_minutes:g} min (step {step} of {config.num_train_steps}); raise "
            f"time_limit_minutes to train on")
    loop.stopped_by = "spent"
  run.report.start(config.num_train_steps, step)
  return loop


def take_step(run: Setup, loop: LoopState) -> None:
  """One optimizer step; the time limit is checked after it."""
  if loop.eta is None:  # this process's first step
    if run.resumed and run.is_main:  # it trains on: its resumable fields may have changed
      workdir_lib.record_config(run.workdir, run.config)
    run.writer.write_config(workdir_lib.config_to_dict(run.config), loop.step)
    loop.eta = Eta(loop.step)
    loop.divergence = DivergenceGuard(run.config.divergence_factor, run.checkpointer.latest_step)
    loop.profiler = StepProfiler(run.config.profile_steps, run.workdir, loop.step)
  loop.profiler.before(loop.step)
  batch = next(run.train_it)
  loop.state, metrics = run.runner.train_step(loop.state, batch, run.dropout_rng)
  loop.step += 1
  loop.unchecked.append((loop.step, metrics))  # the guards take it at the next log row
  loop.profiler.after(loop.step, loop.state)
  loop.window.add(metrics)
  run.report.step(loop.step)
  if loop.step < run.config.num_train_steps and loop.clock.passed(loop.step, run.config.log_every):
    loop.stopped_by = "time"


def check_steps(loop: LoopState) -> None:
  """Feed the guards (non-finite, divergence) the steps done since the last check, in order.
  Called at log rows, before checkpoints and at the end, never per step: the host fetches a
  step's metrics only with its log window, and every process checks at the same steps (so all
  of them stop on the same step when a guard trips)."""
  while loop.unchecked:
    step, metrics = loop.unchecked.popleft()
    loop.guard.push(step, metrics)
    loop.divergence.push(step, metrics)


def log(run: Setup, loop: LoopState, is_last: bool) -> None:
  """A train row in metrics.jsonl every ``log_every`` steps and at the last step, given to the
  reporter (``Reporter.train_row``)."""
  if loop.step % run.config.log_every and not is_last:
    return
  check_steps(loop)  # the window's metrics are fetched now anyway
  m = loop.window.close()
  run.writer.write(loop.step, "train", m)
  total = run.config.num_train_steps
  run.report.train_row(loop.step, total, m, loop.eta(loop.step, total))


def evaluate(run: Setup, loop: LoopState, is_last: bool) -> Optional[Dict[str, float]]:
  """Evaluate every ``eval_every`` steps and at the last step; returns the metrics or None.
  Reports ``num_samples`` samples (translations beside their references; a language model's greedy
  continuations of fixed prompts) and logs them to TensorBoard as text."""
  every = run.config.eval_every
  if not ((every and loop.step % every == 0) or is_last):
    return None
  run.report.evaluating()
  state = loop.state
  on_devices = lambda: run.runner.device_params(state)  # decoded where the parameters are
  metrics = run.evaluator(lambda batch: run.runner.eval_step(state, batch), on_devices)
  lines = _samples(run, on_devices)
  if lines:
    run.report.line(f"  samples at step {loop.step}:\n" + "\n".join(lines))
    run.writer.write_text("eval/samples", "\n".join(lines), loop.step)
  run.writer.write(loop.step, "eval", metrics)
  run.report.line(f"eval at step {loop.step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
  loop.window.restart_clock()
  loop.final = metrics
  return metrics


def checkpoint(run: Setup, loop: LoopState, is_last: bool, evaluated) -> None:
  """Save every ``checkpoint_every`` steps, at the last step, on a stop, and at each evaluation
  when ``best_metric`` is set; never a state that follows a non-finite or diverged step."""
  config = run.config
  due = (loop.stopped_by or is_last
         or (config.checkpoint_every and loop.step % config.checkpoint_every == 0)
         or (config.best_metric and evaluated is not None))
  if not due:
    return
  check_steps(loop)
  loop.guard.check()
  loop.divergence.check()
  with workdir_lib.disk_errors(run.checkpointer.directory, "saving a checkpoint to"):
    run.checkpointer.save(loop.step, run.runner.host_state(loop.state), run.train_it.get_state(),
                          evaluated, {"pending": loop.window.packed(),
                                      "train_seconds": loop.clock.trained_seconds()})


def finish(run: Setup, loop: LoopState, preemption: Preemption) -> Dict[str, float]:
  """Report how training ended; unless stopped by a signal, write the final parameters and the plots:
  params.msgpack (one process, or pmap), or params/ (a multi-process mesh run: orbax, each
  process its own shards, nothing gathered; ``txf.runtime.workdir.load_params`` reads either)."""
  config, say = run.config, run.report.line
  if loop.stopped_by == "signal":  # every process says why it ended (the same line on each)
    run.writer.close()
    run.every_process.stopped(
        f"txf: stopped by {preemption.signal_name} after step {loop.step}; checkpoint written to "
        f"{run.checkpointer.step_dir(loop.step)}. Run the same command to resume.")
    return loop.final
  if loop.stopped_by == "time":
    say(f"txf: time limit of {config.time_limit_minutes:g} min reached: training ended after step "
        f"{loop.step} of {config.num_train_steps} (evaluated, checkpointed, params saved; raise "
        f"time_limit_minutes and run again to go on)")
  if loop.start >= config.num_train_steps:
    say(f"the run in {run.workdir} is already complete ({config.num_train_steps} steps)")
  # params files hold the real vocabulary: without the padding rows of model.vocab_multiple
  if jax.process_count() > 1 and getattr(run.runner, "mesh", None) is not None:
    # no host holds the parameters whole: every process writes its own shards to params/
    workdir_lib.save_params_sharded(
        run.workdir, unpad_vocab(run.runner.host_state(loop.state).params, run.model_cfg))
  else:  # one process (or pmap's replicas): one host copy, params.msgpack
    params = run.runner.host_params(loop.state)
    if run.is_main:
      workdir_lib.save_params(run.workdir, unpad_vocab(params, run.model_cfg))
  if run.is_main:
    _write_plots(run.workdir, say)
  run.writer.close()
  return loop.final


def _samples(run: Setup, on_devices: Callable[[], Any]) -> List[str]:
  """The sample lines of an evaluation (none when ``num_samples`` is 0 or nothing was decoded)."""
  num = run.config.num_samples
  if num and run.evaluator.hypotheses:
    out = []
    for e, h in list(zip(run.evaluator.examples, run.evaluator.hypotheses))[:num]:
      mark = "ok " if " ".join(h.split()) == " ".join(e.reference.split()) else "   "
      out.append(f"  {mark}src: {e.source}\n     ref: {e.reference}\n     hyp: {h}")
    return out
  if num and families.get(run.model_cfg.family).decoding == "lm" and not run.custom_model:
    prompts = lm_prompts(run.evaluator.batches, num)
    texts = lm_samples(run.model_cfg, run.task, on_devices(), prompts)
    return [f"  {t}" for t in texts]
  return []


def _restore_target(runner, abstract_state):
  """What a checkpoint is restored onto, whatever the device count it was written with: straight
  into the runner's shardings if it has them (mesh: ``abstract_state``, no host holds the whole
  state), else host numpy arrays (``ShapeDtypeStruct`` leaves without a sharding) that
  ``place_state`` then copies to devices."""
  sharded = getattr(runner, "abstract_state", None)
  return abstract_state if sharded is None else sharded(abstract_state)


def _write_plots(workdir: str, say) -> None:
  """The run's plots; a full or read-only disk is a DiskError (params.msgpack is written by then, so
  running the command again after freeing space writes them), any other failure a warning."""
  from txf.train import viz  # deferred: matplotlib takes a second to import
  try:
    with workdir_lib.disk_errors(workdir, "writing the plots to", need_bytes=1 << 20):
      paths = viz.write_run_plots(workdir)
    say("plots: " + ", ".join(paths))
  except workdir_lib.DiskError:
    raise
  except Exception as e:  # a plotting failure must not lose a finished run
    say(f"warning: could not write plots: {e}")
