"""BLEU under the two protocols (txf.inference.bleu): sacreBLEU on detokenized text, and tok-lc
(lowercased Moses tokens, multi-bleu.perl), checked against a hand-worked example and an
independent n-gram count; the tok-lc form of Multi30k-style lines; data.file_pattern; txf eval --bleu."""

import collections
import json
import math
import os
import subprocess
import sys

import pytest

from test_data_fixtures import config_for, write_lines
from txf.core.config import ConfigError, validate
from txf.data import builders
from txf.inference import bleu

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def multi_bleu(hyps, refs):
  """multi-bleu.perl's corpus BLEU (0-100) of whitespace tokens, counted here independently:
  clipped n-gram matches and hypothesis n-grams summed over the corpus for n = 1..4, brevity
  penalty exp(1 - r / c) when the hypotheses are shorter; 0 when some order has no match."""
  matches, totals, c, r = [0] * 4, [0] * 4, 0, 0
  for h, ref in zip(hyps, refs):
    ht, rt = h.split(), ref.split()
    c, r = c + len(ht), r + len(rt)
    for n in range(1, 5):
      hc = collections.Counter(tuple(ht[i:i + n]) for i in range(len(ht) - n + 1))
      rc = collections.Counter(tuple(rt[i:i + n]) for i in range(len(rt) - n + 1))
      matches[n - 1] += sum(min(k, rc[g]) for g, k in hc.items())
      totals[n - 1] += max(len(ht) - n + 1, 0)
  if min(matches) == 0:
    return 0.0
  bp = 1.0 if c > r else math.exp(1 - r / c)
  return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(matches, totals)) / 4)


def test_hand_worked_example():
  # unigrams 5/6 (a second "the" is clipped), bigrams 3/5, trigrams 2/4, 4-grams 1/3; same length:
  # BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = (1/12) ** (1/4) = 0.537285
  out = bleu.corpus_bleu(["the cat sat on the mat"], ["the cat sat on a mat"], "tok-lc")
  assert out["bleu"] == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)
  assert out["bleu_protocol"] == "tok-lc" and "tok:none" in out["bleu_signature"]
  # a shorter hypothesis: precisions 4/5, 2/4, 1/3, 0/2 -> 0, multi-bleu.perl's answer (no smoothing)
  out = bleu.corpus_bleu(["the cat sat the mat"], ["the cat sat on a mat"], "tok-lc")
  assert out["bleu"] == 0.0
  # ... and with every order matched: precisions 5/5, 4/4, 3/3, 2/2, brevity penalty exp(1 - 6/5)
  out = bleu.corpus_bleu(["the cat sat on a"], ["the cat sat on a mat"], "tok-lc")
  assert out["bleu"] == pytest.approx(100 * math.exp(1 - 6 / 5), abs=1e-9)


# Multi30k test2016-style lines (lowercased, tokenized, &quot; / &apos; escapes): the reference
# and a hypothesis that differs in a few words, one line shorter than its reference.
REFS = ["ein mann mit einem orangefarbenen hut , der etwas anstarrt .",
        "ein boston terrier läuft über saftig-grünes gras vor einem weißen zaun .",
        "ein mädchen in einem karateanzug bricht ein brett mit einem tritt .",
        "fünf leute in winterjacken und mit helmen stehen im schnee mit schneemobilen im hintergrund .",
        "ein mann hält ein schild , auf dem &quot; willkommen &quot; steht ."]
HYPS = ["ein mann mit einem orangen hut starrt auf etwas .",
        "ein boston terrier rennt über das grüne gras vor einem weißen zaun .",
        "ein mädchen im karateanzug bricht ein brett mit einem tritt .",
        "fünf personen in winterjacken und helmen stehen im schnee .",
        "ein mann hält ein schild mit der aufschrift &quot; willkommen &quot; ."]


def test_tok_lc_equals_multi_bleu_on_tokenized_lines():
  expected = multi_bleu(HYPS, REFS)
  assert 20 < expected < 80                           # all four orders match somewhere
  assert bleu.corpus_bleu(HYPS, REFS, "tok-lc", "de")["bleu"] == pytest.approx(expected, abs=1e-9)


def test_tok_lc_lowercases_normalises_and_tokenizes_raw_text():
  raw = ['Ein Mann hält ein Schild, auf dem "Willkommen" steht.',
         "Zwei Hunde spielen im Schnee."]
  assert bleu.tokenize_lowercase(raw, "de") == [
      "ein mann hält ein schild , auf dem &quot; willkommen &quot; steht .",
      "zwei hunde spielen im schnee ."]
  # already tokenized text is left as it is, so raw and tok references score alike
  assert bleu.tokenize_lowercase(REFS, "de") == REFS
  english = ["a man &apos;s dog &quot; rex &quot; runs ."]   # Moses splits English clitics: 's
  assert bleu.tokenize_lowercase(english, "en") == english
  assert bleu.tokenize_lowercase(['A man\'s dog "Rex" runs.'], "en") == english
  raw_hyps = [h.replace("&quot; willkommen &quot; .", '"Willkommen".').capitalize() for h in HYPS]
  assert bleu.corpus_bleu(raw_hyps, REFS, "tok-lc", "de")["bleu"] == pytest.approx(
      multi_bleu(HYPS, REFS), abs=1e-9)
  # sacreBLEU's default protocol is cased: the capitalised hypotheses lose there
  cased = bleu.corpus_bleu(raw_hyps, REFS, "sacrebleu", "de")
  assert cased["bleu_protocol"] == "sacrebleu" and "tok:13a" in cased["bleu_signature"]
  assert cased["bleu"] < multi_bleu(HYPS, REFS)
  with pytest.raises(ValueError, match="tok-lc"):
    bleu.corpus_bleu(HYPS, REFS, "multi-bleu")


def test_file_pattern_names_the_files_of_each_split(tmp_path):
  folder = tmp_path / "m30k"
  (folder / "tok").mkdir(parents=True)
  for split, n in (("train", 3), ("val", 2)):
    for lang in ("en", "de"):
      write_lines(folder / "tok" / f"{split}.lc.norm.tok.{lang}", [f"{split} {lang} {i}" for i in range(n)])
  spec = builders.local_spec(str(folder), "parallel", ["train", "val", "test"], "en", "de", 1000, 0.9,
                             "tok/{split}.lc.norm.tok.{lang}")
  assert spec["splits"] == {s: [str(folder / "tok" / f"{s}.lc.norm.tok.{l}") for l in ("en", "de")]
                            for s in ("train", "val")}   # test absent: skipped
  cfg = config_for(f"text:{folder}", "")
  cfg.data.file_pattern = "tok/{split}.lc.norm.tok"
  with pytest.raises(ConfigError, match=r"file_pattern.*\{lang\}"):
    validate(cfg)
  cfg.data.file_pattern = "tok/{split}.{kind}.{lang}"
  with pytest.raises(ConfigError, match=r"file_pattern"):
    validate(cfg)
  cfg.data.file_pattern = "tok/{split}.lc.norm.tok.{lang}"
  validate(cfg)
  cfg.bleu_protocol = "multi-bleu"
  with pytest.raises(ConfigError, match="bleu_protocol"):
    validate(cfg)


@pytest.mark.slow
def test_txf_eval_reports_either_protocol(tmp_path):
  """A 2-step run on tok-style files; txf eval --bleu tok-lc and sacrebleu on the same hypotheses."""
  folder = tmp_path / "data"
  (folder / "tok").mkdir(parents=True)
  words = ["ein", "mann", "hund", "läuft", "&quot;", "gras", ",", "."]
  for split, n in (("train", 64), ("val", 12)):
    for lang, shift in (("en", 0), ("de", 1)):
      write_lines(folder / "tok" / f"{split}.lc.norm.tok.{lang}",
                  [" ".join(words[(i + j + shift) % len(words)] for j in range(3 + i % 4)) for i in range(n)])
  cfg = config_for(f"text:{folder}", str(tmp_path / "tfds"), test_split="val")
  cfg.data.file_pattern = "tok/{split}.lc.norm.tok.{lang}"
  cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                   max_len=32)
  cfg.update(num_train_steps=2, batch_size=8, eval_every=0, checkpoint_every=0, decode_examples=0,
             num_samples=0, log_every=2)
  work = tmp_path / "run"
  from txf.train import train
  train(cfg, str(work))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  cli = [sys.executable, "-m", "txf.cli"]
  reports = {}
  for protocol in ("tok-lc", "sacrebleu"):
    out = tmp_path / f"{protocol}.json"
    result = subprocess.run(cli + ["eval", f"--workdir={work}", "--split=val", f"--bleu={protocol}",
                                   "--max_extra=3", f"--output={out}"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    reports[protocol] = json.loads(out.read_text())
  assert reports["tok-lc"]["bleu_protocol"] == "tok-lc" and "tok:none" in reports["tok-lc"]["bleu_signature"]
  assert reports["sacrebleu"]["bleu_protocol"] == "sacrebleu"
  assert "tok:13a" in reports["sacrebleu"]["bleu_signature"]
  result = subprocess.run(cli + ["eval", f"--workdir={work}", "--bleu=multi"], env=env,
                          capture_output=True, text=True, timeout=300)
  errors = [l for l in result.stderr.splitlines() if l.startswith("txf: error:")]
  assert result.returncode == 2 and len(errors) == 1 and "--bleu" in errors[0], result.stderr


def test_tiny_multi30k_experiment_reads_the_tokenized_files():
  """experiments/multi30k_en_de_tiny.py is valid, is the paper's Transformer-Tiny, and (with the
  shared data beside the checkout) names the tok/*.lc.norm.tok.* files of all three splits."""
  from txf.core.config import load_experiment
  from txf.data.text import resolve_text_dir
  cfg = load_experiment("multi30k_en_de_tiny")
  validate(cfg)
  m = cfg.model
  assert (m.d_model, m.d_ff, m.num_heads, m.num_encoder_layers, m.num_decoder_layers) == (128, 256, 4, 4, 4)
  assert cfg.bleu_protocol == "tok-lc" and cfg.keep_checkpoints == 10
  root = os.path.join(os.path.dirname(ROOT), "shared", "data")
  if not os.path.isdir(os.path.join(root, "multi30k", "tok")):
    pytest.skip("the shared Multi30k data is not beside this checkout")
  d = cfg.data
  folder = resolve_text_dir(d.source.partition(":")[2], root)
  spec = builders.local_spec(folder, d.format, [d.train_split, d.eval_split, d.test_split],
                             d.src_lang, d.tgt_lang, d.max_line_chars, 0.9, d.file_pattern)
  assert sorted(spec["splits"]) == ["test_2016_flickr", "train", "val"]
  assert spec["splits"]["val"][1] == os.path.join(folder, "tok", "val.lc.norm.tok.de")


def test_tok_lc_makes_the_multi30k_tok_files_from_the_raw_ones():
  """The shared Multi30k test2016 (raw, and the papers' tok files): tok-lc turns the raw German and
  English references into the tok files line for line, and leaves the tok files as they are."""
  root = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")
  if not os.path.isdir(os.path.join(root, "tok")):
    pytest.skip("the shared Multi30k data is not beside this checkout")
  for lang in ("de", "en"):
    with open(os.path.join(root, f"test_2016_flickr.{lang}"), encoding="utf-8") as f:
      raw = f.read().split("\n")[:-1]
    with open(os.path.join(root, "tok", f"test_2016_flickr.lc.norm.tok.{lang}"), encoding="utf-8") as f:
      tok = f.read().split("\n")[:-1]
    assert len(raw) == len(tok) == 1000
    assert bleu.tokenize_lowercase(raw, lang) == tok
    assert bleu.tokenize_lowercase(tok, lang) == tok
