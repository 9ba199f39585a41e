"""The rules ``txf.core.config.validate`` checks, each a pure function of the config (or its
sections) returning the problems it finds as lines naming the field and the fix; an empty list
when the config passes. ``validate`` joins them into one ConfigError.

Each reads a complete config (``txf.core.config.complete``: every field present, at
base_config's default when the config did not set it), so no rule restates a default."""

import math
from typing import Dict, Iterable, List, Optional, Tuple

import ml_collections

from txf.core import families, formats, objectives
from txf.core.config_mesh import MESH_AXES, rule_axes


def numeric_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """Sizes that must be positive, the vocabulary multiple, the optimizer's rates and moments,
  the cosine schedule's warmup, and batch_size against grad_accum_steps."""
  errors: List[str] = []
  m, o, d = cfg.model, cfg.optimizer, cfg.data

  def positive(section: str, names: Iterable[str]):
    for n in names:
      v = cfg[section][n] if section else cfg[n]
      if v is not None and (not isinstance(v, (int, float)) or v <= 0):
        errors.append(f"{section + '.' if section else ''}{n}={v!r} must be positive")

  positive("", ["num_train_steps", "batch_size", "log_every", "grad_accum_steps"])
  positive("model", ["d_model", "num_heads", "max_len"])
  if not isinstance(m.d_ff, int) or m.d_ff < 0:
    errors.append(f"model.d_ff={m.d_ff!r} must be an integer >= 0 (0: attention-only layers, no FFN)")
  multiple = m.vocab_multiple
  if not isinstance(multiple, int) or multiple < 0:
    errors.append(f"model.vocab_multiple={multiple!r} must be an integer >= 0 (0 = auto: 1 on CPU, "
                  f"128 on GPU/TPU or when a tensor axis splits the vocabulary)")
  positive("optimizer", ["warmup_steps", "learning_rate"])
  if o.learning_rate_scale <= 0:
    errors.append(f"optimizer.learning_rate_scale={o.learning_rate_scale} must be > 0 "
                  f"(<= 0 trains by gradient ascent or not at all): the paper's is 1.0")
  for n in ["b1", "b2"]:
    if not 0.0 <= o[n] < 1.0:
      errors.append(f"optimizer.{n}={o[n]} must be in [0, 1) (Adam's moment decay; the paper "
                    f"uses b1=0.9, b2=0.98)")
  if o.eps <= 0:
    errors.append(f"optimizer.eps={o.eps} must be > 0 (Adam divides by sqrt(v) + eps; "
                  f"the paper's is 1e-9)")
  if not 0.0 <= o.momentum < 1.0:
    errors.append(f"optimizer.momentum={o.momentum} must be in [0, 1) (muon's momentum; "
                  f"its paper's is 0.95)")
  if o.muon_adam_lr_ratio <= 0 or not 0.0 <= o.final_lr_fraction <= 1.0:
    errors.append(f"optimizer.muon_adam_lr_ratio={o.muon_adam_lr_ratio} must be > 0 and "
                  f"optimizer.final_lr_fraction={o.final_lr_fraction} in [0, 1]")
  if (o.schedule == "cosine" and isinstance(cfg.num_train_steps, int)
      and o.warmup_steps >= cfg.num_train_steps):
    errors.append(f"optimizer.schedule='cosine' decays after the warmup: warmup_steps="
                  f"{o.warmup_steps} must be < num_train_steps={cfg.num_train_steps}")
  accum, batch = cfg.grad_accum_steps, cfg.batch_size
  if (isinstance(accum, int) and isinstance(batch, int) and accum > 0 and batch > 0
      and not d.tokens_per_batch and batch % accum):
    errors.append(f"batch_size={batch} is not divisible by grad_accum_steps={accum}: each "
                  f"micro-batch must have the same rows; make batch_size a multiple of {accum}")
  return errors


def eval_metrics(cfg: ml_collections.ConfigDict) -> Tuple[str, ...]:
  """The metric names an evaluation of this config's run logs (the keys best_metric may name):
  the family's (``txf.core.families.Family.metrics``), plus exact_match and bleu for a family that
  decodes a source (``decoding="seq2seq"``) when the run decodes examples (decode_examples > 0)."""
  family = families.get(cfg.model.family)
  names = family.metrics
  if family.decoding == "seq2seq" and cfg.decode_examples > 0:
    names = names + families.DECODED_METRICS
  return names


def best_metric_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """``best_metric`` ("" = off) must be a metric this run's evaluations log (``eval_metrics``)."""
  best, family = cfg.best_metric, cfg.model.family
  if not best or family not in families.names() or best in eval_metrics(cfg):
    return []
  return [f"best_metric={best!r} is never logged by a {family} run with this config (its "
          f"evaluations log {', '.join(eval_metrics(cfg))}): pick one of those, or '' for none"]


def run_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """The cooldown, the divergence factor and the time limit; layer counts, head_dim, the logits
  scale, T5's shared relative bias, and d_model against num_heads."""
  errors: List[str] = []
  m, o = cfg.model, cfg.optimizer
  cooldown = o.cooldown_steps
  if cooldown < 0 or (cooldown > cfg.num_train_steps > 0):
    errors.append(f"optimizer.cooldown_steps={cooldown} must be in [0, num_train_steps="
                  f"{cfg.num_train_steps}] (0 = no cooldown)")
  factor = cfg.divergence_factor
  if not isinstance(factor, (int, float)) or (factor != 0 and factor <= 1):
    errors.append(f"divergence_factor={factor!r} must be > 1 (a loss this many times its running "
                  f"minimum stops the run) or 0 (off)")
  if cfg.time_limit_minutes < 0:
    errors.append(f"time_limit_minutes={cfg.time_limit_minutes} must be >= 0 (0 = no limit)")
  for n in ["num_encoder_layers", "num_decoder_layers"]:
    if m[n] < 0:
      errors.append(f"model.{n}={m[n]} must be >= 0")
  head_dim = m.head_dim
  if not isinstance(head_dim, int) or head_dim < 0:
    errors.append(f"model.head_dim={head_dim!r} must be an integer >= 0 (0 = d_model / num_heads)")
  scale = m.logits_scale
  if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
    errors.append(f"model.logits_scale={scale!r} must be a finite number > 0 (1.0 = none; T5's "
                  f"tied head: d_model ** -0.5)")
  if m.relative_shared and m.positional != "relative":
    errors.append(f"model.relative_shared=True shares T5's relative bias table, which "
                  f"model.positional={m.positional!r} has not: set model.positional=relative "
                  f"or model.relative_shared=False")
  if not head_dim and m.d_model > 0 and m.num_heads > 0 and m.d_model % m.num_heads:
    h, dm = m["num_heads"], m["d_model"]
    ok = [k for k in range(1, dm + 1) if dm % k == 0 and abs(k - h) <= max(h, 4)]
    errors.append(f"model.d_model={dm} is not divisible by model.num_heads={h}: d_k = d_model / h must be "
                  f"an integer; use num_heads in {ok[:6]} or change d_model")
  return errors


def span_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """The problems of ``config.pretrain``'s span-corruption fields for a model.family
  span_corruption run: T5's counts of a window of L = data.max_input_len tokens (num_noise =
  round(L * density) in [1, L - 1], num_spans = max(1, round(num_noise / mean_span_length))) need
  num_spans non-noise tokens, num_spans sentinels and model.max_len >= L - num_noise + num_spans + 1
  (the corrupted input's length)."""
  if cfg.model.family != "span_corruption":
    return []
  p, length = cfg.pretrain, cfg.data.max_input_len
  density, mean_span = p.noise_density, p.mean_span_length
  sentinels, max_len = p.num_sentinels, cfg.model.max_len
  if not 0.0 < density < 1.0 or mean_span < 1.0 or sentinels < 1 or length < 2:
    return [f"pretrain.noise_density={density} must be in (0, 1), pretrain.mean_span_length="
            f"{mean_span} >= 1, pretrain.num_sentinels={sentinels} >= 1 and data.max_input_len="
            f"{length} >= 2 (span corruption; T5's are 0.15, 3.0, 100)"]
  noise, spans = objectives.span_counts(length, density, mean_span)
  errors = []
  if spans > length - noise or spans > sentinels:
    errors.append(f"span corruption of data.max_input_len={length} tokens makes {spans} noise "
                  f"spans of {noise} tokens, which needs {spans} other tokens and {spans} "
                  f"sentinels (pretrain.num_sentinels={sentinels}): lower pretrain.noise_density "
                  f"or raise pretrain.mean_span_length / pretrain.num_sentinels")
  if max_len and length - noise + spans + 1 > max_len:
    errors.append(f"model.max_len={max_len} is shorter than the span-corrupted input "
                  f"({length - noise + spans + 1} tokens): raise model.max_len or lower "
                  f"data.max_input_len")
  return errors


def kv_heads_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """The problems of ``model.num_kv_heads`` (0 or a divisor of num_heads; with a mesh whose tensor
  axis is given and splits the key/value heads, a multiple of it)."""
  hk, h = cfg.model.num_kv_heads, cfg.model.num_heads
  if not isinstance(hk, int) or hk < 0 or not isinstance(h, int) or h <= 0:
    return [] if isinstance(hk, int) and hk >= 0 else [
        f"model.num_kv_heads={hk!r} must be an integer >= 0 (0 = num_heads)"]
  if hk and (hk > h or h % hk):
    ok = [k for k in range(1, h + 1) if h % k == 0]
    return [f"model.num_kv_heads={hk} does not divide model.num_heads={h}: each key/value head "
            f"serves h / h_kv query heads; use one of {ok} (or 0 = num_heads)"]
  shape, rule = tuple(cfg.mesh_shape or ()), cfg.sharding_rules.kv_heads
  tensor = shape[2] if cfg.parallelism == "mesh" and len(shape) == 3 else 1
  if 0 < hk < h and isinstance(tensor, int) and tensor > 1 and "tensor" in rule_axes(rule) and hk % tensor:
    return [f"model.num_kv_heads={hk} does not split over the tensor axis of mesh_shape={shape}: "
            f"use a multiple of {tensor}, or set sharding_rules.kv_heads='' to replicate the "
            f"key/value heads on every tensor shard"]
  return []


def positional_errors(m) -> List[str]:
  """The impossible settings of the position variants that act inside attention."""
  errors, kind = [], m.positional
  h, dm = m.num_heads, m.d_model
  dk = m.head_dim or (dm // h if h > 0 and dm % h == 0 else 0)
  if kind == "rope":
    if isinstance(dk, int) and dk % 2:
      width = "model.head_dim" if m.head_dim else "d_model / num_heads"
      errors.append(f"model.positional=rope rotates pairs of columns: d_k = {width} = {dk} must "
                    f"be even")
    if not m.rope_base > 1:
      errors.append(f"model.rope_base={m.rope_base!r} must be > 1 (RoPE's frequencies "
                    f"theta_i = base^(-2i/d_k); the paper's is 10000)")
    if m.rope_scaling != "none" and not m.rope_scaling_factor > 0:
      errors.append(f"model.rope_scaling_factor={m.rope_scaling_factor!r} must be > 0")
    if m.rope_scaling == "llama3" and not (
        0 < m.rope_low_freq_factor < m.rope_high_freq_factor and m.rope_original_max_len > 0):
      errors.append(f"model.rope_scaling=llama3 needs 0 < rope_low_freq_factor "
                    f"({m.rope_low_freq_factor!r}) < rope_high_freq_factor "
                    f"({m.rope_high_freq_factor!r}) and rope_original_max_len > 0")
  if kind == "relative":
    buckets, distance = m.relative_buckets, m.relative_max_distance
    if not isinstance(buckets, int) or buckets < 4 or buckets % 2:
      errors.append(f"model.relative_buckets={buckets!r} must be an even integer >= 4 (the "
                    f"encoder's buckets are split per sign, each half exact then logarithmic; T5: 32)")
    elif not isinstance(distance, int) or distance <= buckets // 2:
      errors.append(f"model.relative_max_distance={distance!r} must be an integer > "
                    f"relative_buckets / 2 = {buckets // 2} (where the logarithmic buckets end; T5: 128)")
  return errors


def mlm_errors(p) -> List[str]:
  """The masked-LM settings that cannot work: a rate outside (0, 1], fractions outside [0, 1] or
  summing to more than 1."""
  out = []
  rate = p.mask_rate
  if not isinstance(rate, (int, float)) or not 0.0 < rate <= 1.0:
    out.append(f"pretrain.mask_rate={rate!r} must be in (0, 1] (BERT: 0.15 of the tokens predicted)")
  fractions = [p.mask_token_fraction, p.random_token_fraction]
  if (not all(isinstance(f, (int, float)) and 0.0 <= f <= 1.0 for f in fractions)
      or sum(fractions) > 1.0 + 1e-9):
    out.append(f"pretrain.mask_token_fraction={fractions[0]!r} and pretrain.random_token_fraction="
               f"{fractions[1]!r} must each be in [0, 1] with a sum <= 1 (the rest of the chosen "
               f"tokens stay unchanged; BERT: 0.8 and 0.1)")
  return out


def file_pattern_errors(given: Dict[str, object]) -> List[str]:
  """``data.file_pattern`` (of the flattened config ``given``) must name its files with
  ``{split}`` (and ``{lang}`` for parallel data), and no other placeholder."""
  errors: List[str] = []
  pattern = given["data.file_pattern"]
  if pattern:
    fmt = given["data.format"]
    per_language = fmt in formats.names() and formats.get(fmt).per_language
    needs = ["{split}"] + (["{lang}"] if per_language else [])
    missing = [n for n in needs if n not in pattern]
    try:
      pattern.format(split="train", lang="en")
    except (KeyError, IndexError, ValueError):
      missing = missing or ["only {split} and {lang} (no other braces)"]
    if missing:
      errors.append(f"data.file_pattern={pattern!r} lacks {' and '.join(missing)}: write the file "
                    f"names with placeholders, e.g. 'tok/{{split}}.lc.norm.tok.{{lang}}'")
  return errors


def range_errors(cfg: ml_collections.ConfigDict, given: Dict[str, object]) -> List[str]:
  """Rates in [0, 1), counts >= 0, the beam, the token types, special-logit masking against
  label smoothing, the sharding rules' mesh axes and dcn_mesh_shape (``given``: the flattened
  config)."""
  errors: List[str] = []
  for key in ["model.dropout_rate", "model.attention_dropout_rate", "optimizer.label_smoothing"]:
    v = given[key]
    if not 0.0 <= v < 1.0:
      errors.append(f"{key}={v} must be in [0, 1)")
  for key in ["eval_every", "checkpoint_every", "beam_size", "keep_checkpoints"]:
    if given[key] < 0:
      errors.append(f"{key}={given[key]} must be >= 0")
  if not 0 <= given["data.id_store_tokens"] <= 2 ** 31 - 1:
    errors.append(f"data.id_store_tokens={given['data.id_store_tokens']} must be in "
                  f"[0, 2**31 - 1] (0 keeps no ids in memory)")
  if given["model.decoder_start_id"] < 0 or given["model.position_offset"] < 0:
    errors.append(f"model.decoder_start_id={given['model.decoder_start_id']} and model.position_offset="
                  f"{given['model.position_offset']} must be >= 0")
  if not isinstance(given["model.type_vocab_size"], int) or given["model.type_vocab_size"] < 0:
    errors.append(f"model.type_vocab_size={given['model.type_vocab_size']!r} must be an integer "
                  f">= 0 (0 = no token-type table; BERT: 2)")
  if given["beam_size"] < 1:
    errors.append("beam_size must be >= 1")
  if given["model.mask_special_logits"] and given["optimizer.label_smoothing"]:
    errors.append(f"model.mask_special_logits=True (an imported GPT-2) needs "
                  f"optimizer.label_smoothing=0, got {given['optimizer.label_smoothing']}: "
                  f"smoothing would spread mass onto the masked ids")
  for logical, value in cfg.sharding_rules.items():
    for axis in rule_axes(str(value or "")):
      if axis not in MESH_AXES:
        errors.append(f"sharding_rules.{logical}={value!r} names mesh axis {axis!r}, which does not "
                      f"exist: use some of {MESH_AXES} ('' = replicated)")
  dcn = tuple(cfg.dcn_mesh_shape or ())
  if dcn and (len(dcn) != 3 or any(s == 0 or s < -1 for s in dcn) or list(dcn).count(-1) > 1):
    errors.append(f"dcn_mesh_shape={dcn} must be () or 3 positive sizes (data, fsdp, tensor) across "
                  f"slices (or processes), at most one -1; e.g. (2, 1, 1) for data parallel over 2 slices")
  return errors


def length_errors(cfg: ml_collections.ConfigDict, data_lengths: Optional[dict]) -> List[str]:
  """model.max_len against the data's lengths (``data_lengths``: {"max_input_len": S,
  "max_target_len": T}, or None), span corruption's counts, and profile_steps."""
  errors: List[str] = []
  m = cfg.model
  if data_lengths and m.max_len:
    for name, length in data_lengths.items():
      if length and length > m["max_len"]:
        errors.append(f"model.max_len={m['max_len']} is shorter than the data's {name}={length}: "
                      f"raise model.max_len to at least {length} or lower data.{name}")
  errors += span_errors(cfg)
  profile = cfg.profile_steps
  if profile:
    parts = str(profile).split(":")
    if not (len(parts) == 2 and all(p.strip().isdigit() for p in parts) and 1 <= int(parts[0]) < int(parts[1])):
      errors.append(f"profile_steps={profile!r} must be START:END with 1 <= START < END (steps START "
                    f"to END-1 are traced), e.g. profile_steps=10:13")
  return errors


# The optimizers whose per-parameter learning-rate scaling under mup is defined (txf.nn.mup).
MUP_OPTIMIZERS = ("adam", "lion")


def mup_errors(cfg: ml_collections.ConfigDict) -> List[str]:
  """``model.mup_base_width`` (an integer >= 0, 0 = d_model; read only under muP, so that a sweep
  may set it for every arm) and, with ``model.parametrization=mup``,
  an optimizer whose mup learning-rate rule is defined (Adam's entrywise-normalised update, which
  Lion's sign update shares): Adafactor scales each update by the parameter's own RMS and Muon
  orthogonalises it, neither of which the Adam table covers."""
  m, name = cfg.model, cfg.optimizer.name
  base = m.mup_base_width
  if not isinstance(base, int) or isinstance(base, bool) or base < 0:
    return [f"model.mup_base_width={base!r} must be an integer >= 0 (the d_model at which mup "
            f"equals the standard parametrization; 0 = model.d_model)"]
  if m.parametrization == "mup" and name not in MUP_OPTIMIZERS:
    return [f"model.parametrization=mup with optimizer.name={name!r}: its width scaling is "
            f"defined here for {', '.join(MUP_OPTIMIZERS)} only (the Adam table of Tensor "
            f"Programs V; {name} rescales its updates by other rules): use optimizer.name=adam "
            f"or lion, or model.parametrization=standard"]
  return []
