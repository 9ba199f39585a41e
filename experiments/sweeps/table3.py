"""The model variations of "Attention Is All You Need" (Vaswani et al. 2017), Table 3, at the size a
CPU trains, with seeds and intervals: Transformer-Tiny on Multi30k en->de.

The paper's Table 3 varies its base model (N 6, d_model 512, d_ff 2048, h 8, d_k = d_v 64, dropout
0.1, label smoothing 0.1) one thing at a time and reports per-wordpiece perplexity and BLEU on
newstest2013, one run per row. Here the base row is Transformer-Tiny
(experiments/multi30k_en_de_tiny.py: N 4+4, d_model 128, d_ff 256, h 4, d_k 32, dropout 0.3,
label smoothing 0.1) and each row that has a meaning at this size is an arm, 3 seeds each:

  (A) heads at fixed compute, d_k = d_model / h:  A_h1 (d_k 128), A_h2 (64), A_h8 (16)
      [the paper: h 1, 4, 16, 32 against 8; A_h2 is its "half the heads", A_h8 its "twice"]
  (B) a smaller key size, h kept:                 B_dk16 (half), B_dk8 (a quarter)
      [the paper: d_k 32 and 16 against 64, d_v kept at 64; txf's model.head_dim sets d_k = d_v,
      so here the values shrink too and the arm loses more parameters than the paper's row]
  (C) depth:  C_N2, C_N6 (2 and 6 layers in each stack) [the paper's N 4 and 8 against 6]
      width:  C_d64, C_d256 (d_model 64 and 256: h and d_ff kept, so d_k = d_model / h scales, as
              the paper's d_model 256 and 1024 rows keep h 8 and d_ff 2048 with d_k 32 and 128;
              the inverse-sqrt schedule's peak learning rate goes with d_model^-0.5, as the paper's)
      FFN:    C_ff128, C_ff512 (d_ff halved and doubled) [the paper's d_ff 1024 and 4096]
  (D) dropout: D_drop0, D_drop0.6 (0 and doubled) [the paper's 0.0 and 0.2 against 0.1]
      label smoothing: D_ls0, D_ls0.2 [the paper's 0.0 and 0.2]
  (E) learned positions instead of sinusoids: E_learned (model.positional=learned)

17 arms x 3 seeds = 51 runs. The paper's rows with no counterpart here: (A) h 32 (d_k 4 at
d_model 128 is beyond the paper's range), (C) N 2 (one layer is not a Transformer stack worth
comparing), the big model.

Metrics as the paper's Table 3 reports them: per-wordpiece perplexity on val, exp of the
token-level NLL of the targets without label smoothing (eval/perplexity = exp(eval/nll)), and
tok-lc BLEU on val (lowercased Moses tokens, multi-bleu.perl's), decoding the whole val set
(1,014 sentences) with beam 4 and length penalty alpha 0.6 (GNMT's), no checkpoint averaging
(section 6.2 of the paper); one evaluation, at the last step. test2016 is not scored in a study.

Run length: STEPS updates of ~4k tokens a side, the warmup cut to 300 with the peak learning rate
kept at 0.005 (learning_rate_scale 0.98 at d_model 128), a 300-step linear cooldown: the settings
of experiments/sweeps/multi30k_kv_heads.py, whose 800 updates gave the base row a seed spread of
0.43 BLEU (greedy, 3 seeds), so that the 95% interval of a difference of two 3-seed means is about
+-1 BLEU, the size of the paper's larger effects. The pilot (the base row alone, 4 seeds, beam 4
on val) kept STEPS = 800: 32.35, 32.75, 32.20, 32.06 BLEU, s = 0.30, so the interval half-width
t_{0.975} * s * sqrt(2/3) is 0.67 BLEU, below ~1 (docs/sweeps.md). Runs of another length are a
new study: change STEPS before the study starts, or use another --root.

  TXF_DATA=../shared/data txf sweep experiments/sweeps/table3.py --parallel 2 --pin_cpus
  txf sweep report runs/sweeps/table3

The runs behind the published table are recorded in experiments/results/table3.jsonl (a sweep
ledger, docs/sweeps.md): `txf sweep report experiments/sweeps/table3.py --ledger
experiments/results/table3.jsonl` reports them without training.

The study resumes where it stopped (complete runs are skipped), so it can run in several sittings.
The report (runs/sweeps/table3/report.md) has a table per metric and, beside the paper's Table 3
(the reference below), each arm's mean difference to the base with its 95% interval, Welch p, the
direction's agreement and the parameter counts; reference.png is the forest plot.
"""

STEPS = 800   # updates per run, kept by the pilot (above)

# The paper's Table 3 (newstest2013, the English-German development set): for each row its
# absolute per-wordpiece perplexity, BLEU and parameters (x 10^6; None where the paper lists none),
# and the arm here that varies the model the same way. The deltas are taken to the paper's base
# row (PPL 4.92, BLEU 25.8, 65 M).
PAPER_BASE = {"row": "base", "ppl": 4.92, "bleu": 25.8, "params": 65}
PAPER_ROWS = {
    "A_h1": {"row": "(A) h=1, dk=dv=512", "ppl": 5.29, "bleu": 24.9, "params": None},
    "A_h2": {"row": "(A) h=4, dk=dv=128", "ppl": 5.00, "bleu": 25.5, "params": None},
    "A_h8": {"row": "(A) h=16, dk=dv=32", "ppl": 4.91, "bleu": 25.8, "params": None},
    "B_dk16": {"row": "(B) dk=32", "ppl": 5.01, "bleu": 25.4, "params": 60},
    "B_dk8": {"row": "(B) dk=16", "ppl": 5.16, "bleu": 25.1, "params": 58},
    "C_N2": {"row": "(C) N=4", "ppl": 5.19, "bleu": 25.3, "params": 50},
    "C_N6": {"row": "(C) N=8", "ppl": 4.88, "bleu": 25.5, "params": 80},
    "C_d64": {"row": "(C) dmodel=256, dk=dv=32", "ppl": 5.75, "bleu": 24.5, "params": 28},
    "C_d256": {"row": "(C) dmodel=1024, dk=dv=128", "ppl": 4.66, "bleu": 26.0, "params": 168},
    "C_ff128": {"row": "(C) dff=1024", "ppl": 5.12, "bleu": 25.4, "params": 53},
    "C_ff512": {"row": "(C) dff=4096", "ppl": 4.75, "bleu": 26.2, "params": 90},
    "D_drop0": {"row": "(D) Pdrop=0.0", "ppl": 5.77, "bleu": 24.6, "params": None},
    "D_drop0.6": {"row": "(D) Pdrop=0.2", "ppl": 4.95, "bleu": 25.5, "params": None},
    "D_ls0": {"row": "(D) els=0.0", "ppl": 4.67, "bleu": 25.3, "params": None},
    "D_ls0.2": {"row": "(D) els=0.2", "ppl": 5.47, "bleu": 25.7, "params": None},
    "E_learned": {"row": "(E) learned positions", "ppl": 4.92, "bleu": 25.7, "params": None},
}

ARMS = {
    "base": {},
    "A_h1": {"model.num_heads": 1},
    "A_h2": {"model.num_heads": 2},
    "A_h8": {"model.num_heads": 8},
    "B_dk16": {"model.head_dim": 16},
    "B_dk8": {"model.head_dim": 8},
    "C_N2": {"model.num_encoder_layers": 2, "model.num_decoder_layers": 2},
    "C_N6": {"model.num_encoder_layers": 6, "model.num_decoder_layers": 6},
    "C_d64": {"model.d_model": 64},
    "C_d256": {"model.d_model": 256},
    "C_ff128": {"model.d_ff": 128},
    "C_ff512": {"model.d_ff": 512},
    "D_drop0": {"model.dropout_rate": 0.0},
    "D_drop0.6": {"model.dropout_rate": 0.6},
    "D_ls0": {"optimizer.label_smoothing": 0.0},
    "D_ls0.2": {"optimizer.label_smoothing": 0.2},
    "E_learned": {"model.positional": "learned"},
}


def _millions(m):
  return None if m is None else int(m * 1_000_000)


def reference():
  """The paper's deltas to its base row, per arm (txf.sweep.reference)."""
  out = {"_source": "Vaswani et al. 2017, Table 3 (newstest2013 dev; base 25.8 BLEU, 4.92 PPL, 65 M)",
         "base": {"row": PAPER_BASE["row"], "params": _millions(PAPER_BASE["params"])}}
  for arm, row in PAPER_ROWS.items():
    out[arm] = {"row": row["row"],
                "eval/bleu": round(row["bleu"] - PAPER_BASE["bleu"], 2),
                "eval/perplexity": round(row["ppl"] - PAPER_BASE["ppl"], 2),
                "params": _millions(row["params"])}
  return out


def get_sweep():
  return {
      "config": "experiments/multi30k_en_de_tiny.py",
      "overrides": {"optimizer.warmup_steps": 300, "optimizer.learning_rate_scale": 0.98,
                    "optimizer.cooldown_steps": 300,
                    "eval_every": STEPS, "decode_examples": 1014, "log_every": 100,
                    "beam_size": 4, "alpha": 0.6, "length_penalty": "gnmt",
                    "checkpoint_every": 200, "keep_checkpoints": 2,
                    "num_samples": 0, "time_limit_minutes": 0.0,
                    "data.tokens_per_batch": 4096},
      "arms": ARMS,
      "baseline": "base",
      "seeds": 3,
      "metrics": ["eval/bleu", "eval/perplexity"],
      "mode": "final",
      "steps": STEPS,
      "reference": reference(),
  }
