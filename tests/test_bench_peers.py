"""The side-by-side script's pure parts (records -> medians -> table and ratios; argument errors).

No peer process runs here: torch is not a dependency of txf. The numbers are made up; the
expected medians and ratios are worked by hand.
"""

import json
import os
import subprocess
import sys

import pytest

from bench import peers
from txf.core.errors import TxfError


def train(peer, config, step, tok, first=None, cpu=None):
  r = dict(peer=peer, config=config, phase="train", step_s=dict(median=step),
           tokens_per_s=dict(median=tok), first_step_s=first)
  if cpu is not None:  # (CPU-s, wall-s) of the whole process
    r.update(process_cpu_s=cpu[0], process_wall_s=cpu[1])
  return r


def decode(peer, config, tok, method=None):
  r = dict(peer=peer, config=config, phase="decode", out_tokens_per_s=dict(median=tok))
  if method:
    r["method"] = method
  return r


RECORDS = [
    # three rounds of txf and two peers at small; medians: txf 2600 tok/s, flax 2500, marian 2900
    # cores used by txf's processes: 1.9, 1.5, 1.8 -> median 1.8
    train("txf", "small", 0.80, 2600, 10.0, (95.0, 50.0)),
    train("txf", "small", 0.70, 2900, 12.0, (60.0, 40.0)),
    train("txf", "small", 0.90, 2300, 11.0, (54.0, 30.0)),
    train("flax-wmt", "small", 0.82, 2500, 22.0), train("flax-wmt", "small", 0.83, 2490, 20.0),
    train("flax-wmt", "small", 0.81, 2510, 24.0),
    train("marian", "small", 0.70, 2900), train("marian", "small", 0.71, 2880),
    train("marian", "small", 0.69, 2950),
    decode("txf", "small", 1500, "beam"), decode("txf", "small", 1700, "beam"),
    decode("txf", "small", 4000, "greedy"), decode("txf", "small", 2500, "beam-bf16"),
    decode("flax-wmt", "small", 1000), decode("flax-wmt", "small", 1100),
    decode("marian", "small", 1200),
    {"framework": "jax", "median_gflops": 200.0},  # a matmul-peak line: not a cell
]


def test_summarize_takes_medians_per_config_and_system():
  cells = peers.summarize(RECORDS)
  assert set(cells) == {("small", "txf"), ("small", "flax-wmt"), ("small", "marian")}
  txf = cells[("small", "txf")]
  assert txf["step_s"] == pytest.approx(0.80) and txf["tok_s"] == pytest.approx(2600)
  assert txf["first_s"] == pytest.approx(11.0) and txf["rounds"] == 3
  assert txf["beam_tok_s"] == pytest.approx(1600) and txf["greedy_tok_s"] == pytest.approx(4000)
  assert txf["beam_bf16_tok_s"] == pytest.approx(2500) and txf["cores"] == pytest.approx(1.8)
  assert cells[("small", "flax-wmt")]["beam_tok_s"] == pytest.approx(1050)
  assert "first_s" not in cells[("small", "marian")]


def test_ratios_against_the_best_peer():
  r = peers.ratios(peers.summarize(RECORDS))["small"]
  assert r["vs_train"] == "marian" and r["train"] == pytest.approx(2600 / 2900)
  assert r["vs_beam"] == "marian" and r["beam"] == pytest.approx(1600 / 1200)
  assert r["first_step"] == pytest.approx(22.0 / 11.0)  # flax-wmt's first step / txf's


def test_format_table_rows_and_ratio_line():
  text = peers.format_table(peers.summarize(RECORDS))
  lines = text.splitlines()
  assert lines[0].startswith("| config | system | train step s | target tok/s")
  assert lines[2] == "| small | txf | 0.800 | 2600 | 11.0 | 1600 | 4000 | 2500 | 1.80 |"
  assert lines[3] == "| small | flax-wmt | 0.820 | 2500 | 22.0 | 1050 | - | - | - |"
  assert lines[4] == "| small | marian | 0.700 | 2900 | - | 1200 | - | - | - |"
  assert ("small: txf / best peer: train 0.90x (best peer marian); beam-4 decode 1.33x "
          "(best peer marian); first step: flax-wmt's / txf's = 2.00") in text


def test_parse_records_keeps_json_lines_only():
  out = peers.parse_records('noise\n{"peer": "x", "a": 1}\n{broken\n  {"b": 2}\n')
  assert out == [{"peer": "x", "a": 1}, {"b": 2}]


def test_argument_errors(tmp_path):
  with pytest.raises(TxfError, match="unknown system"):
    peers.check_args(str(tmp_path), None, None, ["txf", "jax-wmt"], ["small"], 1)
  with pytest.raises(TxfError, match="unknown config"):
    peers.check_args(str(tmp_path), None, None, ["txf"], ["huge"], 1)
  with pytest.raises(TxfError, match="repeats"):
    peers.check_args(str(tmp_path), None, None, ["txf"], ["small"], 0)
  with pytest.raises(TxfError, match="bench_torch.py"):
    peers.check_args(str(tmp_path), None, None, ["txf", "marian"], ["small"], 1)
  (tmp_path / "bench_torch.py").write_text("")
  (tmp_path / "bench_flax.py").write_text("")
  with pytest.raises(TxfError, match="peers_venv"):
    peers.check_args(str(tmp_path), str(tmp_path / "nowhere"), None, ["marian"], ["small"], 1)
  (tmp_path / "venv" / "bin").mkdir(parents=True)
  (tmp_path / "venv" / "bin" / "python").write_text("")
  venv = str(tmp_path / "venv")
  peers.check_args(str(tmp_path), venv, None, ["txf", "marian"], ["small", "base"], 2)  # fine
  with pytest.raises(TxfError, match="train.py"):
    peers.check_args(str(tmp_path), venv, str(tmp_path), ["flax-wmt"], ["small"], 1)
  peers.check_args("", None, None, ["txf"], ["small"], 1)  # txf alone needs no harness


def test_main_reports_bad_arguments_in_one_line(capsys, tmp_path):
  assert peers.main(["--harness", str(tmp_path), "--systems", "txf,marian", "--output", ""]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("txf: error: ") and "bench_torch.py" in err[0]


def test_commands_name_the_harness_scripts():
  argv = peers.command("flax-wmt", "base", "/h", "/v", "/f", 10, 5)
  assert argv[:2] == ["/v/bin/python", "/h/bench_flax.py"] and "--wmt_dir" in argv and "base" in argv
  assert peers.command("marian", "small", "/h", "/v", None, 3, 2)[-6:] == [
      "--phase", "both", "--steps", "3", "--decode-reps", "2"]
  assert peers.command("torch-eager", "small", "/h", "/v", None, 3, 2)[6:8] == ["--phase", "train"]
  assert peers.command("txf", "small", "/h", "/v", None, 3, 2)[1:4] == ["-m", "bench.peers",
                                                                         "--worker"]
  assert peers.command("txf", "small", "/h", "/v", None, 3, 2, bf16_decode=True)[-1] == "--bf16_decode"


FAKE_HARNESS = """
import argparse, json
CONFIGS = {"small": dict(V=8000, d=256, f=1024, h=4, L=3, B=64, S=32, T=32)}
def main():
  p = argparse.ArgumentParser()
  p.add_argument("--config", choices=list(CONFIGS))
  p.add_argument("--peer", default="torch-eager")
  a, _ = p.parse_known_args()
  print(json.dumps(dict(peer=a.peer, config=a.config, sizes=CONFIGS[a.config])))
if __name__ == "__main__":
  main()
"""


@pytest.mark.parametrize("system", ["marian", "flax-wmt"])
def test_a_config_the_harness_lacks_is_added_to_its_table_before_it_runs(tmp_path, system):
  """transformer_tiny: the harness script (here a stand-in with only 'small') is run with the
  tiny sizes added to its CONFIGS, so its own argument parser accepts the config."""
  for name in ("bench_torch.py", "bench_flax.py"):
    (tmp_path / name).write_text(FAKE_HARNESS)
  venv = tmp_path / "venv" / "bin"
  venv.mkdir(parents=True)
  os.symlink(sys.executable, venv / "python")
  argv = peers.command(system, "transformer_tiny", str(tmp_path), str(tmp_path / "venv"), "/f", 3, 2)
  out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  record = json.loads(out.stdout.strip().splitlines()[-1])
  assert record["config"] == "transformer_tiny"
  assert record["sizes"] == dict(V=8000, d=128, f=256, h=4, L=4, B=64, S=64, T=64)
  # the sizes are bench.train's Transformer-Tiny
  from bench import train as train_bench
  tiny = train_bench.BENCH_CONFIGS["transformer_tiny"]
  model = tiny["model"]
  assert (model["d_model"], model["d_ff"], model["num_heads"], model["num_encoder_layers"],
          model["vocab_size"], tiny["batch"], tiny["source_len"]) == (128, 256, 4, 4, 8000, 64, 64)
  # a config the harness knows runs its script as it is
  assert peers.command(system, "small", "/h", "/v", "/f", 3, 2)[1].startswith("/h/bench_")


def test_sitting_interleaves_systems_and_saves_after_every_process(monkeypatch):
  # the processes are faked: each prints one train record naming its system
  calls, saved = [], []

  class Done:
    returncode, stderr = 0, ""

    def __init__(self, argv):
      system = "txf" if "--worker" in argv else argv[argv.index("--peer") + 1] \
          if "--peer" in argv else "flax-wmt"
      config = argv[argv.index("--config" if "--config" in argv else "--configs") + 1]
      self.stdout = "log line\n" + json.dumps(train(system, config, 1.0, 100.0)) + "\n"

  def fake_run(argv, **kwargs):
    calls.append(argv)
    return Done(argv)

  monkeypatch.setattr(peers.subprocess, "run", fake_run)
  records = peers.run_sitting(["txf", "flax-wmt", "marian"], ["small"], 2, "/h", "/v", "/f", 1, 1,
                              None, say=lambda *a: None, progress=lambda r: saved.append(len(r)))
  assert [r["peer"] for r in records] == ["txf", "flax-wmt", "marian"] * 2
  assert [r["round"] for r in records] == [1, 1, 1, 2, 2, 2]
  assert saved == [1, 2, 3, 4, 5, 6] and len(calls) == 6


def test_variants_are_rows_but_not_the_best_peer():
  # txf with bf16 compute and torch under bf16 autocast: their own ratio line, never "the best peer"
  records = RECORDS + [train("torch-bf16", "small", 0.40, 5000), train("txf-bf16", "small", 0.50, 4000),
                       train("txf-attn-dropout", "small", 0.90, 2300)]
  cells = peers.summarize(records)
  r = peers.ratios(cells)["small"]
  assert r["vs_train"] == "marian" and r["train"] == pytest.approx(2600 / 2900)
  text = peers.format_table(cells)
  assert "small: bf16 compute, txf-bf16 / torch-bf16: train 0.80x" in text
  rows = [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| small")]
  assert rows == ["txf", "flax-wmt", "marian", "txf-attn-dropout", "txf-bf16", "torch-bf16"]


def test_variant_commands():
  txf_bf16 = peers.command("txf-bf16", "base", "H", "V", None, 3, 2)
  assert txf_bf16[1:4] == ["-m", "bench.peers", "--worker"]
  assert txf_bf16[txf_bf16.index("--dtype") + 1] == "bfloat16" and "--nodecode" in txf_bf16
  assert txf_bf16[txf_bf16.index("--name") + 1] == "txf-bf16"
  drop = peers.command("txf-attn-dropout", "base", "H", "V", None, 3, 2, bf16_decode=True)
  assert drop[drop.index("--attention_dropout") + 1] == "0.1" and "--bf16_decode" not in drop
  torch_bf16 = peers.command("torch-bf16", "small", "H", "V", None, 3, 2)
  assert torch_bf16[0] == "V/bin/python" and torch_bf16[1] == "-c"
  assert "torch.autocast('cpu', dtype=torch.bfloat16)" in torch_bf16[2]
  assert torch_bf16[3] == "H/bench_torch.py"
  assert torch_bf16[torch_bf16.index("--peer") + 1] == "torch-eager"


def test_before_tree_runs_the_old_worker_and_gets_its_own_ratio_line(tmp_path):
  argv = peers.command("txf-before", "small", "H", "V", None, 3, 2, bf16_decode=True,
                       before_tree="/old/txf")
  assert argv[1] == "-c" and "sys.path.insert(0, sys.argv.pop(1))" in argv[2]
  assert argv[3] == "/old/txf" and argv[4:6] == ["--worker", "--configs"] and "--bf16_decode" in argv
  records = RECORDS + [train("txf-before", "small", 1.0, 2000), decode("txf-before", "small", 800, "beam")]
  cells = peers.summarize(records)
  assert peers.ratios(cells)["small"]["vs_train"] == "marian"  # the old code is not a peer
  assert "small: txf / txf-before (the same sitting): train 1.30x, beam-4 2.00x" in peers.format_table(cells)
  assert peers.main(["--systems", "txf,txf-before", "--output", ""]) == 2  # no --before_tree
  assert peers.main(["--before_tree", str(tmp_path), "--systems", "txf", "--output", ""]) == 2


def test_the_old_code_with_bf16_compute_is_its_own_row_and_ratio():
  argv = peers.command("txf-bf16-before", "base", "H", "V", None, 3, 2, bf16_decode=True,
                       before_tree="/old/txf")
  assert argv[3] == "/old/txf" and argv[argv.index("--dtype") + 1] == "bfloat16"
  assert "--nodecode" in argv and "--bf16_decode" not in argv
  records = RECORDS + [train("txf-bf16", "base", 2.0, 1000), train("txf-bf16-before", "base", 2.5, 800),
                       train("torch-bf16", "base", 2.6, 770)]
  cells = peers.summarize(records)
  table = peers.format_table(cells)
  assert "base: txf-bf16 / txf-bf16-before (the same sitting): train 1.25x" in table, table
  assert "base: bf16 compute, txf-bf16 / torch-bf16: train 1.30x" in table, table
  assert "vs_train" not in peers.ratios(cells).get("base", {})  # neither old code nor torch-bf16 is a peer
  assert peers.main(["--systems", "txf-bf16,txf-bf16-before", "--output", ""]) == 2  # no tree
