"""The registry of model families: one record per family, and every other module asks it.

A family is what a run's ``model.family`` names: the module that computes it, the batch keys it
reads, what it predicts (a token per position or a label per example, which sets the loss
weighting and the metrics), the data it trains on, whether and how it decodes, and the command
that serves a trained run. txf's four families are declared below (encoder_mlm, BERT's masked LM,
trains on plain text through its own loss, which masks each batch); a new one is one module plus one
:func:`register` line (from any Python file the run names in ``config.plugins``)::

    from txf.core import families
    families.register(families.Family(
        name="bag_of_words", module=BagOfWords, inputs=("inputs",), predicts="label",
        data_kind="tsv", command="txf classify"))

This module is plain data and imports no jax (the config layer checks ``model.family`` with it):
a family's module is named either by the object itself (a flax module class, or any
``build(cfg) -> nn.Module``) or by the string ``"package.module:Class"`` that the models layer
imports when a model of the family is first built.
"""

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from txf.core.errors import TxfError

# The metrics every evaluation logs; token predictors add perplexity, translation adds the decoded.
BASE_METRICS = ("loss", "nll", "accuracy")
DECODED_METRICS = ("exact_match", "bleu")
DATA_KINDS = ("parallel", "tsv", "plain")   # txf.data's real tasks: translation, labelled, text
DECODINGS = ("seq2seq", "lm")               # encode the source then decode | continue a prompt
PREDICTS = ("targets", "label")
PIECES = ("", "sentinels", "mask")          # a tokenizer's extra pieces: none | <extra_id_N> | mask
SERVES = ("translate", "classify", "sample", "fill_masks", "fill_spans")  # what serving does


class FamilyError(TxfError, ValueError):
  """An unknown family, or a record that cannot work; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Family:
  """One model family.

  name:      the value of ``model.family``.
  module:    the flax module class (called with the run's TransformerConfig), any
             ``build(cfg) -> nn.Module``, or ``"package.module:Attribute"`` naming one.
  inputs:    the batch keys passed to the module's ``__call__`` as keyword arguments (keys the
             batch lacks are left out: segmentation and positions come only with packing).
  predicts:  "targets": one prediction per target token, weight 0 on padding (loss, nll and
             accuracy per token, plus perplexity); "label": one per example against
             ``batch["label"]``, weight 0 on all-padding filler rows.
  data_kind: the real data it trains on (``DATA_KINDS``): parallel | tsv | plain; None: only
             the synthetic tasks (which feed every family that predicts targets).
  decoding:  "seq2seq" (the model has ``encode`` and ``decode``: beam search, BLEU in
             evaluations), "lm" (``decode_step`` over a prompt: sampling, ``txf generate``), or
             None (never decoded).
  command:   the command that serves a trained run (``txf eval`` serves every family).
  encoder:   whether the model has an encoder stack over ``inputs`` (sizing and FLOPs).
  loss:      the family's training and evaluation objective, ``make(label_smoothing) -> LossFn``
             (``txf.models.LossFn``), or ``"package.module:attribute"`` naming it; None: the
             label-smoothed cross-entropy over ``forward`` (``txf.models.cross_entropy_loss``).
             A loss given to ``txf.train(..., loss_fn=...)`` still takes precedence.
  lengths:   what the model reads when its loss rewrites each batch (a pretraining objective):
             ``lengths(max_input_len, pretrain) -> (encoder_len, target_len)`` for data rows of
             ``max_input_len`` tokens and the run's ``config.pretrain``, or
             ``"package.module:attribute"`` naming it; None: the data's own lengths
             (``data.max_input_len``, ``data.max_target_len``). ``txf plan`` sizes by it.
  reads:     the other data kinds it trains on (``DATA_KINDS``): a family of plain text that
             reads "tsv" takes a labelled TSV's text column as plain text; one that reads
             "parallel" takes both sides of each pair as text (its task must handle both).
  task:      the real-data task class (``txf.data.base.Task``), or ``"package.module:Class"``
             naming it, built by ``Class.for_run(data, sources, adapt, codec, fingerprint,
             family=, pretrain=, whole_word=)``; None: the task of its data kind
             (``txf.data.real.new_task``).
  pieces:    the tokenizer's extra pieces its objective needs (``PIECES``): "" none,
             "sentinels" (``pretrain.num_sentinels`` ``<extra_id_N>``), "mask" (a mask token).
  serves:    what its serving ``command`` does with an input line (``SERVES``): "translate",
             "classify", "sample" (continue a prompt), "fill_masks" (each mask token's most
             likely tokens), "fill_spans" (each ``<extra_id_N>``'s span); None: not served.
  token_head: whether the module's ``__call__(..., project=False)`` returns (final hidden states,
             output table), so the default loss may fuse the output projection with the
             cross-entropy (``txf.models.cross_entropy_loss``; only for a model of exactly the
             family's module class).
  hf_classes: the Hugging Face (model, tokenizer) classes ``txf export-hf`` says load the export.
  """
  name: str
  module: Any
  inputs: Tuple[str, ...]
  predicts: str = "targets"
  data_kind: Optional[str] = None
  decoding: Optional[str] = None
  command: str = "txf eval"
  encoder: bool = False
  loss: Any = None
  lengths: Any = None
  reads: Tuple[str, ...] = ()
  task: Any = None
  pieces: str = ""
  serves: Optional[str] = None
  token_head: bool = False
  hf_classes: Tuple[str, str] = ("AutoModel", "AutoTokenizer")

  @property
  def metrics(self) -> Tuple[str, ...]:
    """What an evaluation logs (the names ``best_metric`` may take), decoded metrics aside."""
    return BASE_METRICS + (("perplexity",) if self.predicts == "targets" else ())

  @property
  def batch_keys(self) -> Tuple[str, ...]:
    """The keys of a batch of this family's data: the model's inputs plus ``label``."""
    return self.inputs + (("label",) if self.predicts == "label" else ())

  def check(self) -> None:
    """FamilyError naming the first field that cannot work."""
    if not self.name or not isinstance(self.name, str):
      raise FamilyError(f"a family needs a name, got {self.name!r}")
    if self.predicts not in PREDICTS:
      raise FamilyError(f"family {self.name!r}: predicts={self.predicts!r} is not one of {PREDICTS}")
    if self.data_kind is not None and self.data_kind not in DATA_KINDS:
      raise FamilyError(f"family {self.name!r}: data_kind={self.data_kind!r} is not one of "
                        f"{DATA_KINDS} (or None)")
    if self.decoding is not None and self.decoding not in DECODINGS:
      raise FamilyError(f"family {self.name!r}: decoding={self.decoding!r} is not one of "
                        f"{DECODINGS} (or None)")
    if any(kind not in DATA_KINDS for kind in self.reads):
      raise FamilyError(f"family {self.name!r}: reads={self.reads!r} names a kind that is not one "
                        f"of {DATA_KINDS}")
    if self.pieces not in PIECES:
      raise FamilyError(f"family {self.name!r}: pieces={self.pieces!r} is not one of {PIECES}")
    if self.serves is not None and self.serves not in SERVES:
      raise FamilyError(f"family {self.name!r}: serves={self.serves!r} is not one of {SERVES} "
                        f"(or None)")
    if self.predicts == "targets" and "targets" not in self.inputs:
      raise FamilyError(f"family {self.name!r} predicts targets, so its inputs must include "
                        f"'targets' (the model reads them shifted right)")


_REGISTRY: Dict[str, Family] = {}


def register(family: Family, replace: bool = False) -> Family:
  """Add ``family`` to the registry and return it. A name already taken raises FamilyError unless
  ``replace`` (re-importing the same plugin file is fine: the same record again is a no-op)."""
  family.check()
  old = _REGISTRY.get(family.name)
  if old is not None and not replace and _describe(old) != _describe(family):
    raise FamilyError(f"model family {family.name!r} is already registered (by {_describe(old)}): "
                      f"choose another name or pass replace=True")
  _REGISTRY[family.name] = family
  return family


def _describe(family: Family) -> str:
  module = family.module
  if isinstance(module, str):
    return module
  return f"{getattr(module, '__module__', '?')}:{getattr(module, '__qualname__', repr(module))}"


def unregister(name: str) -> None:
  """Remove a family (tests register toy families and take them out again)."""
  _REGISTRY.pop(name, None)


def names() -> Tuple[str, ...]:
  """Every registered family's name, in registration order (txf's four first)."""
  return tuple(_REGISTRY)


def get(name: str) -> Family:
  """The record of ``name``; FamilyError naming the registered families otherwise."""
  if name not in _REGISTRY:
    raise FamilyError(f"unknown model.family {name!r}: choose one of {names()}, or register it "
                      f"(txf.core.families.register) in a file that config.plugins names")
  return _REGISTRY[name]


def resolve(target: Any) -> Any:
  """``target`` itself, or the attribute a ``"package.module:Attribute"`` string names, imported
  now (how a record names its module or loss without importing it)."""
  if not isinstance(target, str):
    return target
  path, _, attr = target.partition(":")
  return getattr(importlib.import_module(path), attr)


def resolve_module(family: Family) -> Any:
  """The family's module class (or builder), resolved (:func:`resolve`)."""
  return resolve(family.module)


# ----------------------------------------------------------------------------- plugins

_PLUGINS: Dict[str, Any] = {}


def plugin_list(value: Any) -> List[str]:
  """``config.plugins`` as a list: a comma-separated string (or a sequence) of Python files or
  importable module names."""
  if isinstance(value, str):
    return [p.strip() for p in value.split(",") if p.strip()]
  return [str(p).strip() for p in (value or ()) if str(p).strip()]


def absolute_plugins(value: Any) -> str:
  """``config.plugins`` with every file path made absolute (a module name is kept): what a run's
  config.json stores, so ``txf eval`` from another directory imports the same files."""
  return ",".join(os.path.abspath(p) if _is_file(p) else p for p in plugin_list(value))


def _is_file(entry: str) -> bool:
  return entry.endswith(".py") or os.sep in entry or "/" in entry


def import_plugins(value: Any) -> None:
  """Import each plugin of ``config.plugins`` once per process (each may register families or
  variants). A missing file or module raises FamilyError naming it; an error inside the plugin's
  own code propagates with its traceback."""
  for entry in plugin_list(value):
    key = os.path.abspath(entry) if _is_file(entry) else entry
    if key in _PLUGINS:
      continue
    if _is_file(entry):
      if not os.path.isfile(key):
        raise FamilyError(f"config.plugins names {entry!r}, which is not a file: give the path of "
                          f"the Python file that registers the family (or an importable module)")
      name = "txf_plugin_" + os.path.splitext(os.path.basename(key))[0]
      spec = importlib.util.spec_from_file_location(name, key)
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      try:
        spec.loader.exec_module(module)
      except BaseException:
        sys.modules.pop(name, None)
        raise
      _PLUGINS[key] = module
    else:
      if importlib.util.find_spec(entry) is None:
        raise FamilyError(f"config.plugins names module {entry!r}, which is not importable: "
                          f"install it or give the path of its .py file")
      _PLUGINS[key] = importlib.import_module(entry)


# ----------------------------------------------------------------------------- txf's families

register(Family(
    name="encoder_decoder", module="txf.models.encoder_decoder:EncoderDecoder",
    inputs=("inputs", "targets", "inputs_segmentation", "targets_segmentation",
            "inputs_position", "targets_position"),
    predicts="targets", data_kind="parallel", decoding="seq2seq", command="txf translate",
    encoder=True, serves="translate", token_head=True,
    hf_classes=("MarianMTModel", "MarianTokenizer")))
register(Family(
    name="encoder_classifier", module="txf.models.encoder_classifier:EncoderClassifier",
    inputs=("inputs", "inputs_segmentation", "inputs_position"),
    predicts="label", data_kind="tsv", decoding=None, command="txf classify", encoder=True,
    serves="classify", hf_classes=("BertForSequenceClassification", "AutoTokenizer")))
register(Family(
    name="decoder_lm", module="txf.models.decoder_lm:DecoderLM",
    inputs=("targets", "targets_segmentation", "targets_position"),
    predicts="targets", data_kind="plain", decoding="lm", command="txf generate", encoder=False,
    serves="sample", token_head=True, hf_classes=("GPT2LMHeadModel", "GPT2TokenizerFast")))
register(Family(
    name="encoder_mlm", module="txf.models.encoder_mlm:EncoderMLM",
    # targets: the original token at each masked position (0 elsewhere), read by the loss only
    # (which makes them: it masks the plain-text windows of each batch, config.pretrain), and
    # predict_positions: the masked positions whose logits the loss needs
    inputs=("inputs", "targets", "inputs_segmentation", "inputs_position", "predict_positions"),
    predicts="targets", data_kind="plain", decoding=None, command="txf generate", encoder=True,
    loss="txf.models.encoder_mlm:mlm_loss", reads=("tsv",),
    task="txf.data.pretraining:StreamMLMTask", pieces="mask", serves="fill_masks",
    hf_classes=("BertForMaskedLM", "AutoTokenizer")))
register(Family(
    # T5's span corruption: the EncoderDecoder (a pretrained run's parameters are an
    # encoder_decoder's) trained on unlabelled text; the loss corrupts each batch's raw "inputs"
    name="span_corruption", module="txf.models.encoder_decoder:EncoderDecoder",
    inputs=("inputs", "targets"), predicts="targets", data_kind="plain", decoding=None,
    command="txf generate", encoder=True, loss="txf.models.span_loss:span_corruption_loss",
    lengths="txf.core.objectives:span_corruption_lengths", reads=("parallel",),
    task="txf.data.pretraining:SpanCorruptionTask", pieces="sentinels", serves="fill_spans",
    token_head=True))
