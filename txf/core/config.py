"""The base experiment config (every field, commented) and its validation.

Every experiment file in experiments/ starts from ``base_config()`` and overrides fields; a field
that is not defined here is an error (catches typos such as ``model.num_head``).
"""

import copy
import difflib
import importlib.util
import inspect
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import ml_collections

from txf.core import config_rules, families, formats
from txf.core.config_rules import eval_metrics  # noqa: F401  (its home was here)
# the mesh arithmetic and ConfigError live below this module; they are imported from here too
from txf.core.config_mesh import (ACCELERATOR_VOCAB_MULTIPLE, MESH_AXES,  # noqa: F401
                             fill_mesh_shape, mesh_axis_sizes, resolve_vocab_multiple, rule_axes,
                             vocab_splits)
from txf.core.errors import ConfigError  # noqa: F401


def base_config() -> ml_collections.ConfigDict:
  """All fields txf knows, with defaults. Override them in an experiment's ``get_config()``."""
  c = ml_collections.ConfigDict()
  c.name = "experiment"          # a label for logs; the workdir defaults to runs/<name>
  c.seed = 0                     # one seed for parameters, dropout and data order
  c.num_train_steps = 1000       # optimizer steps
  c.time_limit_minutes = 0.0     # > 0: end training after this many minutes of training in all, counted across resumes (final eval, checkpoint, params); 0 = off
  c.batch_size = 64              # examples per step, over all devices and processes
  c.log_every = 50               # steps between train-metric lines in metrics.jsonl
  c.eval_every = 500             # steps between evaluations (and at the end); 0 = only at the end
  c.checkpoint_every = 500       # steps between checkpoints (and at the end); 0 = only at the end
  c.keep_checkpoints = 3         # how many recent checkpoints to keep
  c.best_metric = ""             # also keep the best checkpoint by this eval metric ("" = off), e.g. "bleu"
  c.best_mode = "max"            # "max" or "min" for best_metric
  c.nan_policy = "stop"          # on a NaN/Inf loss: "stop" (keep last good checkpoint) or "skip" the batch
  c.divergence_factor = 10.0     # stop (like a NaN) when the smoothed train loss exceeds this x its minimum and its start; 0 = off
  c.eval_batches = 0             # eval batches per evaluation (0 = the whole eval split)
  c.num_samples = 5              # decoded samples printed at each evaluation
  c.decode_examples = 200        # held-out examples decoded for exact match / BLEU (0 = none)
  c.decode_max_extra = 50        # decoding stops at source length + this many tokens
  c.decode_length_bucket = 8     # translation batches: sources longest first, each batch padded to its longest source rounded up to a multiple of this, buffer = that + decode_max_extra (a compile per bucket); 0 = data order, full data.max_input_len (one compile)
  c.beam_size = 1                # beam for in-loop decoding (1 = greedy)
  c.alpha = 0.6                  # length penalty exponent: GNMT ((5 + L) / 6) ** alpha, or L ** alpha (length_penalty="power")
  c.length_penalty = "gnmt"      # beam scores log p(y) / lp(|y|), |y| counting EOS: gnmt | power (Hugging Face's L ** alpha) | average (L) | none (1)
  c.early_stopping = False       # beam: False = stop when no alive beam can beat the K finished; True = at K finished (Hugging Face's early_stopping=True)
  c.decode_dtype = ""            # decoding's weights and compute dtype: "" = the model's; "bfloat16" = cast once per call (faster on a CPU with AVX512-BF16; outputs may differ a little)
  c.bleu_protocol = "sacrebleu"  # BLEU in the loop and txf eval: sacrebleu (cased, detokenized, 13a) | tok-lc (lowercased Moses tokens, multi-bleu.perl)
  c.plugins = ""                 # Python files or modules (comma-separated) imported first: each may register a model family (txf.core.families) or a variant
  c.init_from = ""               # a workdir (a txf run, or one from `txf import-hf`) whose parameters and tokenizer start this run
  c.parallelism = "single"       # "single" (one device), "pmap" (data parallel), "mesh" (jit + shardings)
  c.grad_accum_steps = 1         # micro-batches accumulated per optimizer step
  c.mesh_shape = (-1, 1, 1)      # parallelism="mesh": devices along (data, fsdp, tensor); one -1 takes the rest
  c.sharding_rules = ml_collections.ConfigDict({  # mesh: logical axis -> mesh axes ("a,b"; "" = replicated)
      "batch": "data,fsdp",      # batch rows: data parallel over data x fsdp
      "embed": "fsdp",           # d_model axis of every weight: FSDP shards it
      "heads": "tensor",         # attention heads: tensor parallel
      "kv_heads": "tensor",      # key/value heads of grouped-query attention (model.num_kv_heads > 0): with the query heads; "" = replicated (needed when the tensor axis does not divide num_kv_heads)
      "kv": "",                  # d_k within a head: never split
      "mlp": "tensor",           # d_ff of the FFN: tensor parallel
      "vocab": "tensor",         # embedding rows / output columns: tensor parallel
      "length": "",              # sequence positions (activations, learned position table): not split
      "act_embed": "",           # d_model of activations [B, L, d]: not split (FSDP gathers weights)
      "norm": "",                # LayerNorm gain/bias and FFN b_2 [d]: replicated
      "classes": ""})            # classifier outputs: replicated
  c.compile_cache = ""           # XLA's persistent compilation cache: "" = $TXF_COMPILE_CACHE, else ~/.cache/txf/xla | a folder | off
  c.profile_steps = ""           # "START:END": a jax.profiler trace of steps START..END-1 in workdir/profile/ ("" = off)
  c.dcn_mesh_shape = ()          # mesh: () = one slice; else (data, fsdp, tensor) across slices/processes, mesh_shape within one
  c.tracker = "none"             # also log metrics.jsonl's rows to an experiment tracker (process 0): none | wandb (Weights & Biases: pip install 'txf[wandb]'; honours WANDB_MODE, WANDB_PROJECT, WANDB_DIR; a resumed run continues the same W&B run)

  c.model = ml_collections.ConfigDict()
  m = c.model
  m.family = "encoder_decoder"   # encoder_decoder (translation) | encoder_classifier | decoder_lm | encoder_mlm (masked LM: BERT; trains on plain text, config.pretrain)
  m.d_model = 512                # model width d_model
  m.num_heads = 8                # h; d_k = d_v = d_model / h (unless model.head_dim)
  m.head_dim = 0                 # d_k = d_v of each attention head: 0 = d_model / num_heads (the paper's); > 0 = that width, the projections then [d_model, h * head_dim] (T5 v1.1 small: d_model 512, 6 heads of 64)
  m.num_kv_heads = 0             # key/value heads h_kv: 0 = num_heads (multi-head attention); a divisor of num_heads = grouped-query attention (1 = multi-query), query head i reads key/value head i // (h / h_kv)
  m.qk_norm = "none"             # normalise each query and key head over d_k before Q K^T (a gain [d_k] each for q and k, shared by the heads): none | layer_norm | rms_norm
  m.d_ff = 2048                  # inner width of the position-wise FFN; 0: no FFN sublayer (attention-only layers)
  m.num_encoder_layers = 6       # N encoder layers (encoder_decoder, encoder_classifier)
  m.num_decoder_layers = 6       # N decoder layers (encoder_decoder, decoder_lm)
  m.dropout_rate = 0.1           # P_drop on every sublayer output and on embeddings + PE
  m.attention_dropout_rate = 0.0  # dropout on attention weights (0 in the paper)
  m.pre_ln = False               # False = post-LN as in the paper; True = pre-LN (ablation)
  m.share_embeddings = True      # one embedding matrix for source and target (needs a joint vocabulary)
  m.tie_output = True            # pre-softmax linear shares the target embedding: logits = h E^T
  m.positional = "sinusoidal"    # sinusoidal | learned | none (added to the embeddings) | rope | alibi | relative (inside self-attention), a name of txf.nn.positional.POSITIONAL
  m.rope_base = 10000.0          # positional=rope: theta_i = rope_base^(-2i/d_k), the rotation frequencies of the pairs (x_2i, x_2i+1)
  m.rope_layout = "interleaved"  # positional=rope: which columns form a rotated pair: interleaved (x_2i, x_2i+1: the paper's, GPT-J) | half (x_i, x_i+d_k/2: Hugging Face Llama's rotate_half, GPT-NeoX)
  m.rope_scaling = "none"        # positional=rope: rescaling of the frequencies theta_i: none | linear (theta_i / rope_scaling_factor) | llama3 (Llama 3.1's: low frequencies / factor, high ones kept, a smooth ramp between)
  m.rope_scaling_factor = 1.0    # rope_scaling linear | llama3: the factor s the (low) frequencies are divided by
  m.rope_low_freq_factor = 1.0   # rope_scaling=llama3: wavelengths above rope_original_max_len / this are divided by the factor
  m.rope_high_freq_factor = 4.0  # rope_scaling=llama3: wavelengths below rope_original_max_len / this are kept
  m.rope_original_max_len = 8192  # rope_scaling=llama3: the context the frequencies were trained for
  m.relative_buckets = 32        # positional=relative: rows of each layer's learned T5 bias table [buckets, h] (encoder: half per sign)
  m.relative_shared = False      # positional=relative: False = each self-attention layer has its own table; True = one table per stack (parameter relative_bias of the encoder / decoder), read by all its layers, as T5's
  m.relative_max_distance = 128  # positional=relative: distances >= this share the last (logarithmic) bucket
  m.max_len = 256                # longest sequence the model accepts (learned PE size, decode cache)
  m.layer_norm_eps = 1e-6        # epsilon inside LayerNorm
  m.pooling = "mean"             # encoder_classifier: mean over real tokens | max over real tokens (per feature) | first token
  m.pooler = False               # encoder_classifier: a dense layer and tanh on the pooled vector, tanh(W pool(h) + b) (BERT's pooler: with pooling=first)
  m.attention = "scaled_dot_product"  # the attention formula, a name of txf.kernels.attention.ATTENTION: scaled_dot_product (the paper's) | dot_product (no 1/sqrt(d_k): softmax(Q K^T + B + M) V, T5's)
  m.norm = "layer_norm"          # Add & Norm's normalisation, a name of txf.nn.layers.NORMS: layer_norm (the paper's) | rms_norm (no mean, no beta)
  m.attention_impl = "auto"      # auto (fused on GPU/TPU, reference on CPU) | reference (einsum; weights visible) | fused
  m.dtype = "auto"               # compute dtype: auto (bfloat16 on TPU/GPU, float32 on CPU) | prefer_bfloat16 (also bfloat16 on a CPU with bf16 dot units: AVX512-BF16, AMX) | float32 | bfloat16; parameters, optimizer state, softmax and loss stay float32
  m.residual_dtype = "float32"   # the residual stream x + Sublayer(x) and LayerNorm's input/output: float32 | compute (the compute dtype)
  m.vocab_multiple = 0           # embedding/output tables get ceil(V/m)*m rows, the padding never predicted nor exported; 0 = auto: 1 on CPU, 128 on GPU/TPU, lcm(128, split) when the mesh splits the vocabulary (tensor axis > 1)
  m.ffn_match_params = False     # gated FFN (model.activation reglu | geglu | swiglu) only: hidden size t = 2 d_ff / 3, rounded to the nearest multiple of 8 if that is within 1% of t, else to the nearest integer (d_ff 2048 -> 1368), so that 3 d h ~= 2 d d_ff, the dense FFN's parameter count; no effect on a dense FFN
  m.use_bias = True              # biases b1, b2 of the FFN (and a gated FFN's gate bias c); False: none. Attention biases are model.attention_bias; the norms keep theirs
  m.parallel_block = False       # GPT-J/PaLM block: self-attention and FFN read one shared norm, pre-LN x + Attn(N(x)) + FFN(N(x)), post-LN N(x + Attn(x) + FFN(x)); a decoder layer with cross-attention runs its cross-attention sublayer first (as usual, its own norm), then the parallel pair
  # options of Marian (OPUS-MT) models, see `txf import-hf`; the defaults are the paper's
  m.activation = "relu"          # FFN activation: relu | gelu (exact, erf) | swish (= silu, Marian) | gelu_tanh (tanh approximation: GPT-2, T5 v1.1); gated FFNs (f(x W1 + b1) * (x V + c)) W2 + b2: reglu | geglu | swiglu | geglu_tanh
  m.positional_layout = "interleaved"  # sinusoidal PE: interleaved sin/cos pairs (paper) | sin_cos (all sines, then all cosines: Marian, fairseq)
  m.position_offset = 0          # sinusoidal PE at position + this offset (Marian 0)
  m.embed_scale = True           # token embeddings times sqrt(d_model) (paper; Marian scale_embedding)
  m.attention_bias = False       # biases on the Q, K, V and output projections of attention (Marian: True)
  m.attention_out_bias = True    # with attention_bias: also a bias on the output projection W^O (False: Q, K, V biases only, Qwen2's)
  m.logits_bias = False          # a vector added to the output logits (Marian's final_logits_bias)
  m.logits_scale = 1.0           # output logits = (logits_scale * h) W^T with h the final decoder states: 1.0 = none (the paper); T5 v1.0's tied head: d_model^-0.5
  m.decoder_start_id = 1         # id that starts every decoder input: BOS (1); an imported Marian model starts with its pad (0 in txf)
  m.forbid_pad = False           # decoding never generates PAD (id 0), as Marian's generate
  # options of BERT models, see `txf import-hf`; the defaults leave the paper's model as it is
  m.type_vocab_size = 0          # rows of a learned token-type (segment) table added to the embeddings (BERT: 2); 0 = none. txf's inputs are one segment: every token adds row 0
  m.embed_norm = False           # a LayerNorm (model.norm, its own gain and bias) on embeddings + positions (+ token type), before the embedding dropout (BERT)
  m.mask_special_logits = False  # True: the logits of PAD, BOS and UNK (ids 0, 1, 3) are -1e9 in every forward (never predicted, no probability mass): an imported GPT-2, whose vocabulary has no such tokens (txf adds their rows); needs optimizer.label_smoothing=0
  m.remat = "none"               # recompute layer activations in the backward pass: none | full | dots_saveable | nothing_saveable | ... (jax.checkpoint_policies)
  m.scan_layers = False          # run each stack of layers as one nn.scan (params [N, ...] under "layers"): faster compiles
  m.parametrization = "standard"  # standard (the paper's) | mup (maximal update parametrization, Tensor Programs V: hidden init variance and Adam/Lion rates x base/width, attention logits 1/d_k, output logits x base/width; equal to standard at d_model = mup_base_width; docs/mup.md)
  m.mup_base_width = 0           # parametrization=mup: the d_model at which mup equals standard (the width the hyper-parameters were tuned at); 0 = d_model (no rescaling)

  c.optimizer = ml_collections.ConfigDict()
  o = c.optimizer
  o.name = "adam"                # adam (the paper's; AdamW when weight_decay > 0) | adafactor (T5's) | lion | muon: txf.train.optimizer.OPTIMIZERS
  o.warmup_steps = 4000          # linear warmup length of the inverse-sqrt schedule
  o.learning_rate_scale = 1.0    # multiplies d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
  o.schedule = "inverse_sqrt"    # inverse_sqrt (the paper, above) | constant (learning_rate after a linear warmup) | rsqrt (T5: learning_rate_scale / sqrt(max(step, warmup_steps))) | cosine (linear warmup to learning_rate, half cosine to final_lr_fraction of it at num_train_steps)
  o.learning_rate = 1e-3         # schedule="constant": lr = learning_rate * min(1, step / warmup_steps)
  o.final_lr_fraction = 0.0      # schedule="cosine": the rate it ends at, as a fraction of learning_rate
  o.cooldown_steps = 0           # > 0: the lr falls linearly to 0 over the last this-many of num_train_steps
  o.b1 = 0.9                     # Adam beta1 (paper: 0.9)
  o.b2 = 0.98                    # Adam beta2 (paper: 0.98)
  o.eps = 1e-9                   # Adam epsilon (paper: 1e-9)
  o.weight_decay = 0.0           # decoupled weight decay lambda (adam: > 0 switches to AdamW; lion, muon: theta -= lr * lambda * theta; adafactor: theta -= lambda * theta)
  o.momentum = 0.95              # muon: the Nesterov momentum of the orthogonalised updates
  o.muon_adam_lr_ratio = 0.1     # muon: the AdamW rate of the non-matrix parameters (embeddings, output layer, norms, biases), as a fraction of the schedule's
  o.label_smoothing = 0.1        # epsilon_ls (paper: 0.1); 0 = plain cross-entropy
  o.grad_clip_norm = 0.0         # global-norm clipping (0 = off; the paper does not clip)

  c.pretrain = ml_collections.ConfigDict()
  p = c.pretrain  # the self-supervised objectives (model.family encoder_mlm | span_corruption)
  p.mask_rate = 0.15             # encoder_mlm: fraction of the real (non-special) tokens chosen for prediction
  p.mask_token_fraction = 0.8    # encoder_mlm: of the chosen, the fraction replaced by the mask token
  p.random_token_fraction = 0.1  # encoder_mlm: of the chosen, the fraction replaced by a random token (the rest stay unchanged)
  p.whole_word = False           # encoder_mlm: choose whole words (every piece of a chosen word), not single pieces
  p.noise_density = 0.15         # span_corruption: fraction of the tokens of each row that are noise
  p.mean_span_length = 3.0       # span_corruption: mean length of a noise span
  p.num_sentinels = 100          # span_corruption: sentinel tokens <extra_id_0..N-1> the tokenizer reserves

  c.data = ml_collections.ConfigDict()
  d = c.data
  d.source = "synthetic:translate"  # synthetic:{translate,copy,reverse,sort,repeat} | text:DIR_OR_NAME | tfds:NAME
  d.path = ""                    # root for text:NAME sources; "" = the TXF_DATA environment variable
  d.data_dir = ""                # where prepared tfds/array_record data lives ("" = ~/.cache/txf/tfds)
  d.format = "parallel"          # text sources, a name of txf.core.formats: parallel ({split}.{src}/{split}.{tgt}) | tsv (text<TAB>label) | plain (LM)
  d.file_pattern = ""            # text sources: file names in the folder, with {split} and (parallel) {lang}; "" = {split}.{lang} / {split}.tsv
  d.src_lang = "en"              # source language suffix / tfds feature
  d.tgt_lang = "de"              # target language suffix / tfds feature
  d.train_split = "train"        # split names
  d.eval_split = "val"           # the held-out split of in-loop evaluations and decoded samples
  d.test_split = "test"          # the split `txf eval` scores unless told another
  d.max_input_len = 32           # S: longer sources are dropped (or truncated if truncate=True), counted and logged
  d.max_target_len = 32          # T: likewise for targets (LM: the context length)
  d.truncate = False             # truncate over-long examples instead of dropping them
  d.tokenizer = "word"           # word (synthetic) | sentencepiece | char
  d.vocab_size = 8000            # sentencepiece vocabulary size (specials included)
  d.spm_model_type = "unigram"   # sentencepiece: unigram | bpe
  d.joint_vocab = True           # one vocabulary for source and target
  d.packing = False              # pack several examples per row (segment ids + positions)
  d.bucketing = False            # batch examples of similar length together
  d.tokens_per_batch = 0         # > 0: batch by token count instead of batch_size rows
  d.prefetch = 2                 # batches prepared ahead of the step
  d.id_store_tokens = 67108864   # training ids kept in memory by the length pass (int32, 4 bytes each: 256 MiB); records past it are tokenized again at each read (0 = none, at most 2**31 - 1)
  d.synthetic_min_len = 4        # synthetic tasks: shortest sequence (copy/reverse/sort) or sentence
  d.synthetic_max_len = 12       # synthetic tasks: longest sequence before EOS
  d.synthetic_vocab = 16         # synthetic copy/reverse/sort/repeat: number of distinct symbols
  d.lm_split_fraction = 0.9      # plain-text LM sources without splits: first fraction is train
  d.max_line_chars = 10000       # text sources: lines longer than this many characters are skipped (counted, logged)
  d.spm_input_sentences = 1000000  # sentencepiece trains on at most this many sentences (evenly spaced, deterministic)
  d.spm_num_threads = 1          # sentencepiece training threads (the model depends on it: keep fixed to reproduce)
  d.num_buckets = 4              # bucketing: length buckets, bucket k holds lengths <= ceil(max_len * k / num_buckets)
  d.bucket_window = 64           # bucketing: examples are grouped this many batches' worth at a time
  d.rows_multiple = 8            # token-based batch row counts are rounded down to a multiple of this (device divisibility)
  d.packing_bins = 0             # packing: rows filled at once by first-fit, then cut into batches in a seeded order (0 = the rows of one batch)
  d.read_threads = 2             # unused (tokenizing in threads was slower under the GIL; batches are made ahead by data.prefetch): kept so older configs load
  return c


def complete(cfg: Optional[Mapping[str, Any]] = None, section: str = "") -> ml_collections.ConfigDict:
  """``cfg`` with each field it lacks at ``base_config()``'s default (its ``section``'s, e.g.
  "optimizer", when ``cfg`` is one section): the one place defaults reach a config, where it enters
  (``txf.runtime.workdir.load_config``: an older run's config.json; ``txf.train.train``,
  ``validate``: a config built by hand; the optimizer: a section built by hand), so code reads
  fields as attributes. A ConfigDict is filled in place and returned; a dict (or None) gives a new
  one (a locked one stays locked). Fields base_config lacks stay, for ``validate`` to name."""
  defaults = base_config()[section] if section else base_config()
  if not isinstance(cfg, ml_collections.ConfigDict):
    defaults.update(cfg or {})
    return defaults
  pending = [(cfg, defaults)]
  with cfg.unlocked():  # the command line's config is locked (a typo'd flag is an error)
    while pending:
      have, want = pending.pop()
      for key, value in want.items():
        if key not in have:
          have[key] = value
        elif isinstance(value, ml_collections.ConfigDict) and isinstance(have[key], ml_collections.ConfigDict):
          pending.append((have[key], value))
  return cfg


def field_names() -> List[str]:
  """Every field of ``base_config()`` as a dotted path ('batch_size', 'model.num_heads', ...)."""
  return sorted(_flatten(base_config()))


def experiment_dirs() -> List[str]:
  """Where experiments shipped with txf live: experiments/ of a source checkout (or an editable
  install), then the copy packaged inside an installed txf (txf/experiments)."""
  package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # txf/
  return [os.path.join(os.path.dirname(package), "experiments"), os.path.join(package, "experiments")]


def experiment_names() -> List[str]:
  """Names of the experiments shipped with txf ('default', 'sst2', ...)."""
  names = set()
  for d in experiment_dirs():
    if os.path.isdir(d):
      names.update(f[:-3] for f in os.listdir(d) if f.endswith(".py") and not f.startswith("_"))
  return sorted(names)


def experiment_path(spec: str) -> str:
  """The experiment file that ``--config SPEC`` means.

  An existing file is used as given. Otherwise ``SPEC`` may name an experiment shipped with txf:
  a bare name (``default``, ``sst2``) or its repository path (``experiments/sst2.py``, as the README
  writes it), found in ``experiment_dirs()``, so a non-editable install runs them from anywhere.
  Raises ConfigError naming the available experiments otherwise.
  """
  if os.path.isfile(spec) or (":" in spec and os.path.isfile(spec.split(":", 1)[0])):
    return spec
  name = None
  if os.sep not in spec and "/" not in spec:
    name = spec[:-3] if spec.endswith(".py") else spec
  elif os.path.dirname(os.path.normpath(spec)) == "experiments" and spec.endswith(".py"):
    name = os.path.basename(spec)[:-3]
  if name:
    for d in experiment_dirs():
      path = os.path.join(d, name + ".py")
      if os.path.isfile(path):
        return path
  raise ConfigError(f"no config file {spec}: give the path of an experiment file, or the name of an "
                    f"experiment shipped with txf ({', '.join(experiment_names())})")


def load_experiment(spec: str) -> ml_collections.ConfigDict:
  """``get_config()`` of the experiment ``spec`` names (see ``experiment_path``), ``complete``: how
  one experiment file derives from another (``wmt14_en_de_big`` from ``wmt14_en_de_base``)."""
  path = experiment_path(spec)
  module_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return complete(module.get_config())


def _flatten(cfg: ml_collections.ConfigDict, prefix: str = "") -> dict:
  out = {}
  for k, v in cfg.items():
    key = f"{prefix}{k}"
    if isinstance(v, ml_collections.ConfigDict):
      out.update(_flatten(v, key + "."))
    else:
      out[key] = v
  return out


def fit_cooldown(cfg: ml_collections.ConfigDict, original_steps: int) -> Optional[str]:
  """Scale ``optimizer.cooldown_steps`` down when the run was shortened below it; return a note.

  A run whose ``num_train_steps`` was lowered from the experiment's ``original_steps`` to less
  than its cooldown keeps the cooldown's share of the run:
  ``cooldown' = max(1, round(cooldown * num_train_steps / original_steps))``, at most
  num_train_steps. Changes ``cfg`` in place; returns None when nothing had to change.
  """
  steps, cooldown = cfg.num_train_steps, cfg.optimizer.cooldown_steps
  if not (isinstance(steps, int) and 0 < steps < cooldown and original_steps >= cooldown):
    return None
  scaled = min(steps, max(1, round(cooldown * steps / original_steps)))
  cfg.optimizer.cooldown_steps = scaled
  return (f"num_train_steps={steps} is shorter than the experiment's cooldown_steps={cooldown} "
          f"(of {original_steps} steps): the cooldown is scaled to {scaled} steps, the same share "
          f"of the run")


# The fields whose allowed values are the names of a variant table (txf.core.variants.Table): the
# table, beside its formulas in ops/kernels/nn/models, declares its names here when its module is
# imported (this module is below those and imports none of them). ``validate`` refuses to run before
# they are declared: call txf.train.tables.validate, which imports every table by name (or build
# the model first). The optimizer's tables (OPTIONAL_VARIANT_FIELDS, txf.train.optimizer) are
# checked when declared: a Hugging Face import validates its config below the training layer.
VARIANT_FIELDS = ("model.positional", "model.positional_layout", "model.activation",
                  "model.attention", "model.norm", "model.attention_impl", "model.remat",
                  "model.pooling", "model.qk_norm")
OPTIONAL_VARIANT_FIELDS = ("optimizer.name", "optimizer.schedule")
_declared_choices: Dict[str, Tuple[str, ...]] = {}


def declare_choices(key: str, names: Iterable[str]) -> None:
  """Make ``names`` the allowed values of the config field ``key`` (a dotted path of
  ``base_config()``, e.g. "model.activation"), replacing any earlier declaration; called by the
  variant tables (txf.core.variants.Table) whenever their names change."""
  if key not in _flatten(base_config()):
    raise KeyError(f"declare_choices: {key!r} is not a field of base_config()")
  _declared_choices[key] = tuple(names)


def allowed_values(key: str) -> Optional[Tuple[str, ...]]:
  """The allowed values of config field ``key``: those its variant table declared
  (:func:`declare_choices`), the registered families for ``model.family``, the registered
  formats for ``data.format``, those of ``FIXED_CHOICES``, or None for a field of free values."""
  return _registries().get(key) or _declared_choices.get(key, FIXED_CHOICES.get(key))


def _registries() -> Dict[str, Tuple[str, ...]]:
  """The fields whose values are the names of a registry of this layer (plugins add to them)."""
  return {"model.family": families.names(), "data.format": formats.names()}


# The beam's length penalties lp(L) (txf.decode.beam.length_penalty): the one list of their names.
LENGTH_PENALTIES = ("gnmt", "power", "average", "none")

# The allowed values of the fields that no table or registry owns.
FIXED_CHOICES = {"model.dtype": ("auto", "prefer_bfloat16", "float32", "bfloat16"),
                 "model.residual_dtype": ("float32", "compute"),
                 "parallelism": ("single", "pmap", "mesh"),
                 "nan_policy": ("stop", "skip"), "best_mode": ("max", "min"),
                 "bleu_protocol": ("sacrebleu", "tok-lc"),
                 "data.tokenizer": ("word", "sentencepiece", "char"),
                 "data.spm_model_type": ("unigram", "bpe"),
                 "length_penalty": LENGTH_PENALTIES,
                 "decode_dtype": ("", "float32", "bfloat16"),
                 "tracker": ("none", "wandb"),
                 "model.rope_layout": ("interleaved", "half"),
                 "model.rope_scaling": ("none", "linear", "llama3"),
                 "model.parametrization": ("standard", "mup")}

_SECTIONS = {"c": "", "m": "model.", "o": "optimizer.", "d": "data.", "p": "pretrain."}
_FIELD_LINE = re.compile(r'^\s+(?:(\w)\.(\w+) = |"(\w+)": )(.*?)\s+# (.*)$')


def reference() -> List[Dict[str, Any]]:
  """Every field of ``base_config()``, sorted by key: {"key" (dotted), "default",
  "allowed" (tuple, or None for free values), "meaning"} (the comment on its line in this file).
  What the documentation's configuration reference shows."""
  defaults = _flatten(base_config())
  meanings, rules = {}, False
  for line in inspect.getsource(base_config).splitlines():
    m = _FIELD_LINE.match(line)
    if m is None:
      continue
    if m.group(1):
      key = _SECTIONS[m.group(1)] + m.group(2)
      rules = key == "sharding_rules"
    else:
      key = "sharding_rules." + m.group(3) if rules else None
    if key:
      meanings[key] = m.group(5).strip()
  return [{"key": key, "default": value, "allowed": allowed_values(key),
           "meaning": meanings.get(key, meanings.get(key.rsplit(".", 1)[0], ""))}
          for key, value in defaults.items()]


def validate(cfg: ml_collections.ConfigDict, data_lengths: Optional[dict] = None) -> None:
  """Check a config before anything compiles; raise ConfigError naming every bad field and its fix.

  ``data_lengths``: optional {"max_input_len": S, "max_target_len": T} that the data produces; the
  model's ``max_len`` must cover them.
  """
  errors: List[str] = []
  # checked as the run would read it: a copy, every field it lacks at base_config's default
  cfg = complete(copy.deepcopy(cfg))
  known, given = _flatten(base_config()), _flatten(cfg)
  for key in sorted(set(given) - set(known)):
    close = difflib.get_close_matches(key, known, n=1)
    errors.append(f"unknown field '{key}'" + (f": did you mean '{close[0]}'?" if close else
                                              ": see txf/core/config.py for the fields"))
  m = cfg.model
  errors += config_rules.numeric_errors(cfg)
  try:
    families.import_plugins(cfg.plugins)
  except families.FamilyError as e:
    errors.append(str(e))
  if m.family not in families.names():
    errors.append(f"model.family={m.family!r} is not one of {families.names()} (a new "
                  f"family is registered by a file that config.plugins names: txf.core.families)")
  errors += config_rules.best_metric_errors(cfg)
  errors += config_rules.run_errors(cfg)
  errors += config_rules.kv_heads_errors(cfg)
  errors += config_rules.positional_errors(m)
  errors += config_rules.mlm_errors(cfg.pretrain)
  errors += config_rules.mup_errors(cfg)
  undeclared = [key for key in VARIANT_FIELDS if key not in _declared_choices]
  if undeclared:  # a caller's bug, not the user's: the variant tables were never imported
    raise RuntimeError(f"txf.core.config.validate: the allowed values of {', '.join(undeclared)} are "
                       f"declared by the model's variant tables: call txf.train.tables.validate "
                       f"(or import txf.models) before validating")
  choices = {**FIXED_CHOICES, **_declared_choices, "data.format": formats.names()}
  errors += config_rules.file_pattern_errors(given)
  for key, allowed in choices.items():
    if key in given and given[key] not in allowed:
      errors.append(f"{key}={given[key]!r} is not one of {allowed}")
  errors += config_rules.range_errors(cfg, given)
  errors += config_rules.length_errors(cfg, data_lengths)
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
  if cfg.tracker == "wandb" and importlib.util.find_spec("wandb") is None:
    raise ConfigError("tracker='wandb' needs the wandb package, which is not installed: "
                      "pip install 'txf[wandb]' (or set tracker=none)")
