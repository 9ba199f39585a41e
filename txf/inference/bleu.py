"""Corpus BLEU under either of the two protocols papers use.

``sacrebleu``: cased, detokenized text scored by sacreBLEU's own ``13a`` tokenizer (WMT practice);
the report carries sacreBLEU's signature.

``tok-lc``: the multimodal-MT papers' protocol (Multi30k): hypotheses and references are
lowercased, punctuation-normalised and Moses-tokenized as the Multi30k ``tok/*.lc.norm.tok.*`` files
were made (``lowercase.perl | normalize-punctuation.perl -l L | tokenizer.perl -l L``, here with
``sacremoses``), then scored on their tokens by sacreBLEU with ``tokenize="none"``: the figure
multi-bleu.perl gives on the same files. Text that is already tokenized that way (the ``tok`` files,
and the outputs of a model trained on them) comes back unchanged, because Moses' XML escapes
(``&apos;`` ...) are undone before tokenizing again.

BLEU = BP * exp(mean_{n=1..4} log p_n), p_n = clipped n-gram matches / hypothesis n-grams (over the
corpus), BP = min(1, exp(1 - r / c)) with r, c the reference and hypothesis token counts. ``tok-lc``
does not smooth (an order without a match gives 0, as multi-bleu.perl); ``sacrebleu`` keeps its
default ``exp`` smoothing.
"""

import functools
import html
import re
from typing import Any, Dict, List, Sequence

import sacrebleu

PROTOCOLS = ("sacrebleu", "tok-lc")
PROTOCOL_HELP = ("sacrebleu = cased detokenized text, sacreBLEU 13a tokenizer (WMT); tok-lc = "
                 "lowercased, punctuation-normalised, Moses-tokenized text scored on its tokens "
                 "(multi-bleu.perl; the Multi30k papers)")


_CLITIC = re.compile(r"(\w) '(\w)")  # English Moses tokens "man 's" -> "man's" before tokenizing again


@functools.lru_cache(maxsize=8)
def _moses(lang: str):
  # deferred: sacremoses compiles its rules on import (0.5 s), which only the tok-lc protocol needs
  from sacremoses import MosesPunctNormalizer, MosesTokenizer  # pylint: disable=import-outside-toplevel
  return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def tokenize_lowercase(lines: Sequence[str], lang: str) -> List[str]:
  """The tok-lc form of ``lines``: XML entities undone, lowercased, punctuation normalised, Moses
  tokenized with XML escapes (``&apos;``, ``&quot;`` ...), one space between tokens.

  Idempotent on text already in that form (a model trained on the tok files writes it), so the
  same function serves raw and pre-tokenized references: for English, Moses' split clitics
  (``man 's``) are joined again first (``man's``), else a second pass would split them as quotes.
  On Multi30k val and test2016 (en and de) the ``tok`` files come back unchanged, and the raw
  files come out as the ``tok`` files but for one line (val.de, where the normaliser moves a quote).
  """
  normalizer, tokenizer = _moses(lang)
  out = []
  for line in lines:
    text = html.unescape(line).lower()
    if lang == "en":
      text = _CLITIC.sub(r"\1'\2", text)
    text = normalizer.normalize(text)
    out.append(" ".join(tokenizer.tokenize(text, escape=True, return_str=True).split()))
  return out


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], protocol: str = "sacrebleu",
                lang: str = "en") -> Dict[str, Any]:
  """BLEU of ``hypotheses`` against one reference each under ``protocol`` (``PROTOCOLS``).

  ``lang`` is the target language (Moses' rules differ by language; used by ``tok-lc`` only).
  Returns ``bleu`` (0-100), ``bleu_protocol``, ``bleu_signature`` (sacreBLEU's, whose ``tok:none``
  marks the tokenized protocol) and ``bleu_verbose`` (the n-gram precisions, brevity penalty and
  lengths).
  """
  if protocol not in PROTOCOLS:
    raise ValueError(f"BLEU protocol {protocol!r} is not one of {PROTOCOLS}")
  hyps, refs = list(hypotheses), list(references)
  if protocol == "tok-lc":
    hyps, refs = tokenize_lowercase(hyps, lang), tokenize_lowercase(refs, lang)
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", lowercase=True,
                                    force=True)  # lowercase: already done; the signature says case:lc
  else:
    metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(hyps, [refs])
  return {"bleu": float(score.score), "bleu_protocol": protocol,
          "bleu_signature": str(metric.get_signature()), "bleu_verbose": str(score)}
