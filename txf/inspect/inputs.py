"""One line of text as a batch of a run's family, with labels for its positions (``txf inspect``)."""

import numpy as np

from txf.core import families
from txf.core.errors import TxfError
from txf.core.specials import EOS_ID
from txf.inspect.heads import greedy_decode


def encode_text(run, text: str):
  """(batch, source token labels or None, target token labels or None) of one line of text: a
  translation model's source and its greedy translation (``{"inputs" [1, S], "targets" [1, T]}``),
  a language model's text (``{"targets" [1, T]}``), an encoder's input (``{"inputs" [1, S]}``).
  The labels name the tokens each position reads (decoder inputs start with ``<s>``)."""
  family = families.get(run.family)
  ids = np.asarray(run.task.encode_source(text), np.int32)
  if ids.size == 0:
    raise TxfError(f"--input {text!r} has no tokens")
  labels = lambda row: [run.task.decode_target([int(i)]) or f"<{int(i)}>" for i in row]
  if "inputs" in family.inputs and family.decoding == "seq2seq":
    length = run.task.max_target_len or ids.size + 8
    batch = {"inputs": ids[None], "targets": np.zeros((1, length), np.int32)}
    out = greedy_decode(run, batch)[0]
    end = int(np.argmax(out == EOS_ID)) + 1 if (out == EOS_ID).any() else out.size
    batch["targets"] = out[None, :end]
    src = [_source_label(run, i) for i in ids]
    return batch, src, ["<s>"] + labels(out[:end - 1])
  if "inputs" in family.inputs:
    return {"inputs": ids[None]}, [_source_label(run, i) for i in ids], None
  return {"targets": ids[None]}, None, ["<s>"] + labels(ids[:-1])


def _source_label(run, i) -> str:
  codec = getattr(run.task, "codec", None) or getattr(run.task, "source_codec", None)
  if codec is not None and hasattr(codec, "decode"):
    try:
      return codec.decode([int(i)]) or f"<{int(i)}>"
    except Exception:  # pylint: disable=broad-except  (labels only)
      pass
  return run.task.decode_target([int(i)]) or f"<{int(i)}>"
