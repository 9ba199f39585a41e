"""BERT's masked-language-model corruption (Devlin et al. 2019, section 3.1): which tokens to
predict, and what the model sees in their place. A pure function of (tokens, rng)."""

from typing import Iterable, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np


def allowed_random_ids(vocab_size: int, special_ids: Iterable[int]) -> np.ndarray:
  """The ids a random replacement may take: int32 [V - |specials|], every id in [0, V) that is
  neither PAD (0) nor one of ``special_ids``, in increasing order."""
  special = set(int(i) for i in special_ids) | {0}
  allowed = np.asarray([i for i in range(int(vocab_size)) if i not in special], np.int32)
  if allowed.size == 0:
    raise ValueError(f"a vocabulary of {vocab_size} ids has no non-special id to draw")
  return allowed


def mlm_mask(tokens: jnp.ndarray, rng: jax.Array, *, vocab_size: int, mask_id: int,
             mask_rate: float, mask_token_fraction: float, random_token_fraction: float,
             special_ids: Iterable[int], word_starts: Optional[jnp.ndarray] = None
             ) -> Tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  r"""Choose the tokens to predict and corrupt them, BERT's way.

  A token is *eligible* when it is real (not PAD 0) and not one of ``special_ids`` (BOS, EOS, UNK,
  the mask token, ...). Each row chooses an exact count, as BERT's reference does per sequence:

  $$k_b = \max\bigl(1, \lfloor r\, n_b + \tfrac12 \rfloor\bigr) \quad (k_b = 0 \text{ if } n_b = 0)$$

  units uniformly without replacement, where r = ``mask_rate`` and n_b is the row's number of
  units: eligible tokens, or with ``word_starts`` eligible *words* (a word = an eligible token
  that starts one, ``word_starts`` true or the token before it not eligible, plus the eligible
  tokens that follow it up to the next start; a chosen word has every piece chosen, so with
  whole words r is the fraction of words). Each chosen token then independently becomes
  ``mask_id`` with probability ``mask_token_fraction`` (p_m), a uniformly random non-special id
  (``allowed_random_ids``) with probability ``random_token_fraction`` (p_r), and stays unchanged
  otherwise (BERT: 0.8 / 0.1 / 0.1).

  Args:
    tokens: int [B, T], 0 = padding.
    rng: a jax PRNG key; the result is a pure function of (tokens, rng, the settings).
    vocab_size: V, ids are in [0, V).
    mask_id: the mask token's id.
    mask_rate, mask_token_fraction, random_token_fraction: r, p_m, p_r (p_m + p_r <= 1).
    special_ids: ids never chosen nor drawn as replacements (PAD is always excluded); static.
    word_starts: optional bool [B, T], true where a token begins a word (a sentencepiece piece
      starting with "\u2581").
  Returns:
    (inputs int [B, T]: the corrupted tokens, targets int [B, T]: the original token at chosen
    positions and 0 elsewhere, weights float32 [B, T]: 1 at chosen positions, 0 elsewhere).
  """
  tokens = jnp.asarray(tokens)
  special = sorted(set(int(i) for i in special_ids) | {0, int(mask_id)})
  eligible = (tokens != 0) & ~jnp.isin(tokens, jnp.asarray(special, tokens.dtype))
  k_choose, k_kind, k_random = jax.random.split(rng, 3)
  if word_starts is None:
    starts = eligible
  else:  # a unit starts at a word start, or where an eligible run begins
    before = jnp.pad(eligible[:, :-1], ((0, 0), (1, 0)))
    starts = eligible & (jnp.asarray(word_starts, bool) | ~before)
  n = starts.sum(-1)
  k = jnp.where(n > 0, jnp.maximum(1, jnp.floor(mask_rate * n + 0.5)), 0).astype(jnp.int32)
  # k smallest of uniform scores among the units (non-units score 2 > any uniform): a uniform
  # k-subset
  score = jnp.where(starts, jax.random.uniform(k_choose, tokens.shape), 2.0)
  rank = jnp.argsort(jnp.argsort(score, axis=-1), axis=-1)
  chosen = starts & (rank < k[:, None])
  if word_starts is not None:  # every piece takes its word's choice
    position = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    start_of = jax.lax.cummax(jnp.where(starts, position, -1), axis=1)
    chosen = eligible & (start_of >= 0) & jnp.take_along_axis(
        chosen, jnp.maximum(start_of, 0), axis=1)
  u = jax.random.uniform(k_kind, tokens.shape)
  to_mask = chosen & (u < mask_token_fraction)
  to_random = chosen & (u >= mask_token_fraction) & (u < mask_token_fraction + random_token_fraction)
  allowed = jnp.asarray(allowed_random_ids(vocab_size, special))
  drawn = allowed[jax.random.randint(k_random, tokens.shape, 0, allowed.shape[0])]
  inputs = jnp.where(to_mask, jnp.asarray(mask_id, tokens.dtype),
                     jnp.where(to_random, drawn.astype(tokens.dtype), tokens))
  targets = jnp.where(chosen, tokens, 0)
  return inputs, targets, chosen.astype(jnp.float32)
