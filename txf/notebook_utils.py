"""Helpers the notebooks in notebooks/ share: small mode, where figures go, data paths, attention
maps, and a short in-memory training run for ablations.

Environment variables:
  TXF_NOTEBOOK_SMALL=1  shrink every notebook (steps, seeds, sizes) so it runs in seconds (tests, CI)
  TXF_NOTEBOOK_OUT      folder for the PNGs each notebook writes (default: a temporary folder)
  TXF_DATA              root of the real text data (default: ../shared/data beside the repository)

``fit`` is the loop of txf.train.loop without checkpoints, metric files or decoding: it jit-compiles
the same ``make_train_step`` / ``make_eval_step`` once per configuration and keeps the curves in
memory, so an ablation grid does not pay for workdirs. Its exact match is computed under teacher
forcing: a target sequence is matched when the argmax at every real position is the reference token.
Greedy decoding feeds back its own argmax, so it reproduces the reference exactly when (and only
when) every teacher-forced argmax is right, EOS included: the two exact matches are the same number
(notebooks/03_ablations.ipynb checks this against ``txf.inference.translate_texts``).
"""

import dataclasses
import importlib.util
import os
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from txf import viz

SMALL_ENV, OUT_ENV, DATA_ENV = "TXF_NOTEBOOK_SMALL", "TXF_NOTEBOOK_OUT", "TXF_DATA"
# XLA:CPU spends most of a tiny run compiling; these flags cut compile time several-fold (measured:
# a 1+1-layer train step 37 s -> 5 s on a loaded 2-core machine) at the price of slower code (a
# d_model=128 step ~10x slower), so only small mode uses them.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
_OUT: Dict[str, str] = {}
_COMPILED: Dict[Any, Any] = {}


# ----------------------------------------------------------------------------- settings and paths

def small_mode() -> bool:
  """True when TXF_NOTEBOOK_SMALL is set to anything but "", "0" or "false"."""
  return os.environ.get(SMALL_ENV, "").strip().lower() not in ("", "0", "false", "no")


def pick(full: Any, small: Any) -> Any:
  """``small`` in small mode, else ``full``."""
  return small if small_mode() else full


def configure() -> Dict[str, Any]:
  """Call first in a notebook, before any JAX computation: in small mode, add FAST_COMPILE_FLAGS to
  XLA_FLAGS (read when JAX starts its CPU backend). Returns the settings, for printing."""
  if small_mode():
    flags = os.environ.get("XLA_FLAGS", "")
    if FAST_COMPILE_FLAGS not in flags:
      os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE_FLAGS}".strip()
  return {"small": small_mode(), "figures": output_dir(), "data": data_root()}


def repo_root() -> str:
  """The repository that holds this txf package (the parent of txf/)."""
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def output_dir() -> str:
  """Where notebooks write their PNGs: $TXF_NOTEBOOK_OUT, else one temporary folder per process."""
  path = os.environ.get(OUT_ENV, "")
  if not path:
    path = _OUT.setdefault("tmp", tempfile.mkdtemp(prefix="txf-notebook-"))
  os.makedirs(path, exist_ok=True)
  return path


def data_root() -> Optional[str]:
  """The real-data root ($TXF_DATA, else ../shared/data beside the repository), or None if absent."""
  root = os.environ.get(DATA_ENV, "") or os.path.join(repo_root(), "..", "shared", "data")
  root = os.path.abspath(os.path.expanduser(root))
  return root if os.path.isdir(root) else None


def load_experiment(name: str):
  """``get_config()`` of experiments/<name>.py (or of a path to a config file)."""
  path = name if name.endswith(".py") else os.path.join(repo_root(), "experiments", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"txf_experiment_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


# ----------------------------------------------------------------------------- figures

new_figure = viz.new_figure  # one Figure factory for txf's plots and the notebooks'

def save_figure(fig: Figure, name: str) -> str:
  """Write ``fig`` as output_dir()/name (PNG) and return the path."""
  path = os.path.join(output_dir(), name)
  fig.savefig(path, format="png", bbox_inches="tight")
  return path


def show(path: str):
  """Display a PNG inline in a notebook (returns the IPython Image; prints the path elsewhere)."""
  try:
    from IPython.display import Image, display
  except ImportError:  # pragma: no cover - plain Python
    print(path)
    return None
  image = Image(filename=path)
  display(image)
  return image


# ----------------------------------------------------------------------------- attention maps

def attention_weights(model_cfg, params, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
  """Every attention map of a deterministic forward pass, grouped by kind.

  Runs the model with ``attention_impl='reference'`` (the fused kernel returns no weights) and
  ``mutable=['intermediates']``; each MultiHeadAttention sows its weights [B, h, L_q, L_k].
  Returns {"encoder_self" | "decoder_self" | "cross": float32 [layers, B, h, L_q, L_k]} for the kinds
  the family has (decoder_lm's causal maps are "decoder_self"). Pad batches to fixed lengths to
  reuse one compile; weights on padded keys are 0.
  """
  from txf.models import build_model, model_inputs
  cfg = dataclasses.replace(model_cfg, attention_impl="reference")
  if ("maps", cfg) not in _COMPILED:  # one compile per model (and batch shape)
    model = build_model(cfg, deterministic=True)
    _COMPILED["maps", cfg] = jax.jit(lambda p, b: model.apply(
        {"params": p}, **model_inputs(cfg.family, b), mutable=["intermediates"])[1])
  state = _COMPILED["maps", cfg](params, batch)
  found: Dict[str, Dict[int, np.ndarray]] = {}

  def walk(tree, path):
    for key, value in tree.items():
      if key == "attention_weights":
        stack, layer, kind = path[0], int(path[-2].split("_")[-1]), path[-1]
        name = "cross" if kind == "cross_attention" else (
            "encoder_self" if stack == "encoder" else "decoder_self")
        found.setdefault(name, {})[layer] = np.asarray(value[0], np.float32)
      elif isinstance(value, dict) or hasattr(value, "items"):
        walk(value, path + (key,))

  walk(state["intermediates"], ())
  return {k: np.stack([v[i] for i in sorted(v)]) for k, v in found.items()}


# ----------------------------------------------------------------------------- short runs

@dataclasses.dataclass
class Run:
  """What ``fit`` keeps: the final parameters and the curves.

  train: [(step, mean train loss over the log window)]; train_nll: the same for the plain
  cross-entropy (equal to the loss without label smoothing); evals: [(step, {metric: value})].
  """
  params: Any
  train: List[Tuple[int, float]]
  train_nll: List[Tuple[int, float]]
  evals: List[Tuple[int, Dict[str, float]]]
  seconds: float

  @property
  def final(self) -> Dict[str, float]:
    return self.evals[-1][1] if self.evals else {}


def make_evaluator(model_cfg, label_smoothing: float) -> Callable:
  """jit'd (params, batch) -> sums: loss_sum, nll_sum, correct, count, and for sequence families
  exact (targets whose every real position is predicted) and rows (rows with a real target)."""
  from txf.models import build_model, forward
  from txf.inference import make_eval_step
  eval_step = make_eval_step(model_cfg, label_smoothing)
  model = build_model(model_cfg, deterministic=True)

  def run(params, batch):
    sums = dict(eval_step(params, batch))
    if model_cfg.family != "encoder_classifier":
      logits, targets, weights = forward(model, params, batch)
      right = (jnp.argmax(logits, -1) == targets) | (weights == 0)
      real = weights.sum(-1) > 0
      sums["exact"] = jnp.sum(jnp.all(right, -1) & real)
      sums["rows"] = jnp.sum(real)
    return sums

  return jax.jit(run)


def evaluate(evaluator: Callable, params, batches: Sequence[Dict[str, np.ndarray]]) -> Dict[str, float]:
  """Sum ``evaluator`` over batches -> loss (smoothed), nll (plain CE), accuracy, exact_match."""
  total: Dict[str, float] = {}
  for batch in batches:
    for k, v in jax.device_get(evaluator(params, batch)).items():
      total[k] = total.get(k, 0.0) + float(v)
  count = max(total.get("count", 0.0), 1.0)
  out = {"loss": total["loss_sum"] / count, "nll": total["nll_sum"] / count,
         "accuracy": total["correct"] / count}
  if "exact" in total:
    out["exact_match"] = total["exact"] / max(total["rows"], 1.0)
  return out


def fit(model_cfg, optimizer_cfg, train_batches: Iterator[Dict[str, np.ndarray]],
        eval_batches: Sequence[Dict[str, np.ndarray]], num_steps: int, seed: int = 0,
        log_every: int = 10, eval_every: int = 0, init_params: Optional[Callable] = None) -> Run:
  """Train ``model_cfg`` for ``num_steps`` with txf's own train step; evaluate every ``eval_every``
  steps (0 = only at the end) on ``eval_batches``.

  ``optimizer_cfg`` is a config's ``optimizer`` section (schedule, Adam, label smoothing).
  ``init_params(params) -> params`` may replace initial parameters (e.g. an embedding table).
  The dropout key of step n is fold_in(split(key(seed))[1], n), as in txf.train.loop.
  """
  from flax.linen import unbox
  from txf.models import init_boxed_params
  from txf.train.optimizer import make_optimizer, make_schedule
  from txf.train.steps import create_train_state, make_train_step
  start = time.time()
  first = next(train_batches)
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  ls = optimizer_cfg.label_smoothing
  # One compile per configuration, shared by its seeds; init and eval also by the configurations
  # that differ only in optimizer settings.
  if ("init", model_cfg) not in _COMPILED:
    _COMPILED["init", model_cfg] = jax.jit(lambda rng, b: unbox(init_boxed_params(model_cfg, rng, b)))
  if ("eval", model_cfg, ls) not in _COMPILED:
    _COMPILED["eval", model_cfg, ls] = make_evaluator(model_cfg, ls)
  key = ("train", model_cfg, tuple(sorted(optimizer_cfg.items())))
  if key not in _COMPILED:
    tx = make_optimizer(optimizer_cfg, model_cfg.d_model)
    _COMPILED[key] = tx, jax.jit(make_train_step(model_cfg, tx, ls,
                                                 make_schedule(optimizer_cfg, model_cfg.d_model)))
  init, evaluator = _COMPILED["init", model_cfg], _COMPILED["eval", model_cfg, ls]
  tx, step_fn = _COMPILED[key]
  params = init(init_rng, first)
  if init_params is not None:
    params = init_params(params)
  state = create_train_state(params, tx)
  train, train_nll, evals, window = [], [], [], []
  batch = first
  for step in range(num_steps):
    if step:
      batch = next(train_batches)
    state, metrics = step_fn(state, batch, jax.random.fold_in(dropout_rng, step))
    window.append((metrics["loss"], metrics["nll"]))
    done = step + 1
    if done % log_every == 0 or done == num_steps:
      loss, nll = np.mean(jax.device_get(window), axis=0)
      train.append((done, float(loss)))
      train_nll.append((done, float(nll)))
      window = []
    if (eval_every and done % eval_every == 0) or done == num_steps:
      evals.append((done, evaluate(evaluator, state.params, eval_batches)))
  return Run(jax.device_get(state.params), train, train_nll, evals, time.time() - start)


def quick_train(config, num_steps: Optional[int] = None, eval_examples: int = 500,
                log_every: int = 10, eval_every: int = 0) -> Run:
  """``fit`` on the task of a txf config (e.g. experiments/default.py): its model, optimizer, seed,
  batch size and data, evaluated on the first ``eval_examples`` of the eval split."""
  from txf import config as config_lib
  from txf.data import make_task
  from txf.models import model_config_from
  config_lib.validate(config)
  task = make_task(config)
  model_cfg = model_config_from(config, task)
  batches = task.eval_batches(config.data.eval_split, config.batch_size, eval_examples)
  return fit(model_cfg, config.optimizer, task.train_iterator(config.batch_size, config.seed),
             batches, num_steps or config.num_train_steps, config.seed, log_every, eval_every)


def mean_and_spread(values: Sequence[float]) -> str:
  """"m ± s" (sample std over seeds; just "m" for one value)."""
  v = np.asarray(values, np.float64)
  return f"{v.mean():.3f}" if v.size < 2 else f"{v.mean():.3f} ± {v.std(ddof=1):.3f}"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
  """A Markdown table (display it with IPython.display.Markdown, or print it)."""
  lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
  return "\n".join(lines)


# ----------------------------------------------------------------------------- labelled text

@dataclasses.dataclass
class LabelledText:
  """Sentences with integer labels: train and dev splits, and where they came from."""
  name: str
  train_texts: List[str]
  train_labels: np.ndarray    # int32 [N_train]
  dev_texts: List[str]
  dev_labels: np.ndarray      # int32 [N_dev]
  note: str


def read_labelled_tsv(path: str, limit: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
  """``sentence<TAB>label`` lines (the format of ../shared/data/{sst2,rt-polarity}) -> (texts, labels).
  A header line whose label is not an integer is skipped; a TAB inside the sentence is kept."""
  texts, labels = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      text, _, label = line.rstrip("\n").rpartition("\t")
      if not label.strip().lstrip("-").isdigit():
        continue
      texts.append(text)
      labels.append(int(label))
      if limit and len(texts) >= limit:
        break
  return texts, np.asarray(labels, np.int32)


def sentiment_corpus(name: str = "rt-polarity", root: Optional[str] = None,
                     max_train: Optional[int] = None, max_dev: Optional[int] = None) -> LabelledText:
  """``root/name/{train,dev}.tsv`` (root: ``data_root()``), or — when absent — the toy language.

  The fallback labels toy-English sentences of txf.data.synthetic by their subject's number
  (1 = plural), a task the words alone decide, so the notebook still runs end to end.
  """
  root = data_root() if root is None else root
  folder = os.path.join(root, name) if root else ""
  if folder and all(os.path.isfile(os.path.join(folder, f"{s}.tsv")) for s in ("train", "dev")):
    train = read_labelled_tsv(os.path.join(folder, "train.tsv"), max_train)
    dev = read_labelled_tsv(os.path.join(folder, "dev.tsv"), max_dev)
    return LabelledText(name, *train, *dev, f"real data from {folder}")
  from txf.data.synthetic import translation_pair
  why = (f"{folder} has no train.tsv/dev.tsv" if folder else
         f"no data root (set {DATA_ENV}, or put the data at ../shared/data beside the repository)")
  rng = np.random.default_rng(0)
  n_train, n_dev = max_train or 8000, max_dev or 1000
  pairs = [translation_pair(rng) for _ in range(n_train + n_dev)]
  texts = [s for s, _ in pairs]
  labels = np.asarray([t.split()[-1].endswith("n") for _, t in pairs], np.int32)  # verb agrees: plural
  return LabelledText("toy language (subject number)", texts[:n_train], labels[:n_train],
                      texts[n_train:], labels[n_train:],
                      f"FALLBACK: {why}; using the built-in toy language instead")


def word_vocabulary(texts: Sequence[str], size: int) -> List[str]:
  """The ``size`` most frequent whitespace words (ties: first seen), after the specials
  <pad>, <s>, </s>, <unk> (ids 0-3, as everywhere in txf)."""
  from txf.data.synthetic import SPECIALS
  counts: Dict[str, int] = {}
  for t in texts:
    for w in t.split():
      counts[w] = counts.get(w, 0) + 1
  ranked = sorted(counts, key=lambda w: -counts[w])  # stable: ties keep first-seen order
  return SPECIALS + [w for w in ranked if w not in SPECIALS][:max(size - len(SPECIALS), 0)]


def encode_words(texts: Sequence[str], vocab: Sequence[str], max_words: int) -> np.ndarray:
  """Sentences -> int32 [N, max_words + 1]: the first ``max_words`` words (unknown -> <unk>), then
  </s>, then <pad> = 0."""
  from txf.data.synthetic import WordCodec
  from txf.data.base import pad_batch
  codec = WordCodec(vocab)
  rows = [codec.encode(" ".join(t.split()[:max_words])) for t in texts]
  return pad_batch(rows, max_words + 1)


def classification_batches(ids: np.ndarray, labels: np.ndarray, batch_size: int, seed: int
                           ) -> Iterator[Dict[str, np.ndarray]]:
  """Endless shuffled batches {"inputs" [B, L], "label" [B]}, a new permutation every epoch."""
  rng = np.random.default_rng(seed)
  while True:
    order = rng.permutation(len(ids))
    for s in range(0, len(order) - batch_size + 1, batch_size):
      take = order[s:s + batch_size]
      yield {"inputs": ids[take], "label": labels[take]}


def fixed_batches(ids: np.ndarray, labels: np.ndarray, batch_size: int) -> List[Dict[str, np.ndarray]]:
  """The whole split in [batch_size, L] batches; filler rows are all <pad> (weight 0 in the loss)."""
  out = []
  for s in range(0, len(ids), batch_size):
    x = np.zeros((batch_size, ids.shape[1]), np.int32)
    y = np.zeros((batch_size,), np.int32)
    n = min(batch_size, len(ids) - s)
    x[:n], y[:n] = ids[s:s + n], labels[s:s + n]
    out.append({"inputs": x, "label": y})
  return out
