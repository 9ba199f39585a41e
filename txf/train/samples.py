"""Sample continuations a language-model run prints (and logs to TensorBoard) at each evaluation.

The prompts are fixed for the whole run, the starts of the first eval windows, and decoding is
greedy, so two evaluations differ only by what the model learned in between.
"""

from typing import List

import numpy as np

from txf.data.base import EOS_ID, PAD_ID
from txf.decode.decoders import greedy_continuation
from txf.parallel import placed

PROMPT_TOKENS = 16       # tokens of each prompt (fewer if the eval windows are shorter)
NEW_TOKENS = 48          # tokens sampled after it (fewer if the context is shorter)


def lm_prompts(eval_batches, num: int, length: int = PROMPT_TOKENS) -> np.ndarray:
  """int32 [n, L]: the first ``L`` tokens of the first ``n <= num`` eval rows that have at least
  two tokens before their EOS; ``L`` shrinks so that at least one token of every such row follows
  its prompt ([0, 0] when there is no such row)."""
  rows = [np.asarray(r) for b in eval_batches for r in np.asarray(b["targets"])]
  rows = [r[r != PAD_ID] for r in rows]
  rows = [r[:np.argmax(r == EOS_ID)] if np.any(r == EOS_ID) else r for r in rows]
  rows = [r for r in rows if r.size >= 2][:num]
  if not rows:
    return np.zeros((0, 0), np.int32)
  length = min(length, min(r.size for r in rows) - 1)
  return np.stack([r[:length] for r in rows]).astype(np.int32)


def lm_samples(model_cfg, task, params, prompts: np.ndarray, new_tokens: int = NEW_TOKENS
               ) -> List[str]:
  """Greedy continuations of ``prompts`` [n, L], each as 'prompt text' + 'continuation text'
  (``task.decode_target``), within the context the model trained on (BOS + prompt + new tokens
  <= min(model.max_len, task.max_target_len)). ``params``: a runner's ``DeviceParams`` (decoded
  where the parameters are, only the ids gathered) or plain parameters (the default device)."""
  n, length = prompts.shape
  context = min(model_cfg.max_len, task.max_target_len or model_cfg.max_len)
  new_tokens = min(new_tokens, context - length)
  if n == 0 or new_tokens < 1:
    return []
  new = placed.local(params).run(greedy_continuation(model_cfg, length, new_tokens), prompts)
  return [f"{task.decode_target(p)} | {task.decode_target(c)}" for p, c in zip(prompts, new)]
