"""`txf train` at the terminal: one line per log step when piped, the divergence guard, failed
starts that do not lock a workdir, finished runs whose config.json stays, and disk errors as one
`txf: error:` line (exit 2, nothing lost)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import EXPERIMENTS, ROOT, run_txf
from tests.tb_events import read_events

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

COPY = os.path.join(EXPERIMENTS, "copy.py")
SHORT = ("--config.num_train_steps=50", "--config.log_every=25", "--config.decode_examples=4")


def one_error_line(r) -> str:
  assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
  assert "Traceback" not in r.stderr, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.startswith("txf: error: ")]
  assert len(lines) == 1, r.stderr
  return lines[0]


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
  """A 50-step copy run with no --progress flag, its stdout a pipe (not a terminal)."""
  workdir = str(tmp_path_factory.mktemp("term") / "copy")
  r = run_txf("train", "--config", COPY, "--workdir", workdir, *SHORT)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return workdir, r


LINE = re.compile(r"^step (\d+)/50 \| loss [\d.]+ \| nll [\d.]+ \| acc [\d.]+ \| lr [\d.]+e-\d+ \| "
                  r"[\d,]+ tok/s \| eta \d+s$")


def test_piped_train_prints_one_line_per_log_step_and_no_bar(short_run):
  _, r = short_run
  steps = [int(m.group(1)) for m in map(LINE.match, r.stdout.splitlines()) if m]
  assert steps == [25, 50], r.stdout
  assert "\r" not in r.stdout + r.stderr and "it/s" not in r.stderr  # no tqdm bar
  assert r.stderr == "", r.stderr  # txf's own lines only, no library logs
  assert len(r.stdout.splitlines()) < 20, r.stdout


def test_learning_rate_is_the_value_at_the_logged_step(short_run):
  workdir, _ = short_run
  # copy.py: lr(n) = 0.3 * 64^-0.5 * min(n^-0.5, n * 50^-1.5) for the update of step n (1-based)
  expected = {n: 0.3 * 64 ** -0.5 * min(n ** -0.5, n * 50 ** -1.5) for n in (25, 50)}
  logged = {x["step"]: x["learning_rate"] for x in rows(workdir) if x["split"] == "train"}
  assert logged.keys() == expected.keys()
  for n, lr in expected.items():
    assert logged[n] == pytest.approx(lr, rel=1e-6)  # the window mean would be ~half of it at 25


def test_tensorboard_gets_the_config_and_the_eval_samples(short_run):
  workdir, _ = short_run
  texts, plugins = {}, set()
  for event in read_events(os.path.join(workdir, "tensorboard")):
    for v in event.summary.value:
      plugins.add(v.metadata.plugin_data.plugin_name)
      if v.metadata.plugin_data.plugin_name == "text":
        texts[v.tag] = (event.step, b"".join(v.tensor.string_val).decode())
  assert "hparams" in plugins
  step, config = texts["config/text_summary"]
  assert step == 0 and '"d_model": 64' in config and '"source": "synthetic:copy"' in config
  step, samples = texts["eval/samples/text_summary"]
  assert step == 50 and "src:" in samples and "hyp:" in samples


def test_lr_times_1e6_stops_as_diverged_with_exit_2(tmp_path):
  workdir = tmp_path / "w"
  r = run_txf("train", "--config", COPY, "--workdir", str(workdir), "--progress=false", *SHORT,
              "--config.optimizer.learning_rate_scale=3e5")
  line = one_error_line(r)
  assert re.match(r"txf: error: the loss diverged at step \d+: the smoothed loss [\d.e+]+ is over "
                  r"10x its lowest value", line), line
  assert "lower the learning rate" in line and "divergence_factor" in line
  assert not (workdir / "params.msgpack").exists()


def test_a_failed_start_does_not_lock_the_workdir(tmp_path):
  workdir = str(tmp_path / "w")
  # max_len shorter than the data: found after the workdir was prepared and the data built
  r = run_txf("train", "--config", COPY, "--workdir", workdir, "--progress=false", *SHORT,
              "--config.model.max_len=4")
  assert r.returncode == 2 and "model.max_len=4 is shorter than the data" in r.stderr, r.stderr
  assert os.path.exists(os.path.join(workdir, "config.json"))  # the failed start's
  r = run_txf("train", "--config", COPY, "--workdir", workdir, "--progress=false", *SHORT,
              "--config.num_train_steps=2")
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["max_len"] == 32


def test_resuming_a_finished_run_keeps_its_config_unless_it_trains_on(tmp_path):
  workdir = str(tmp_path / "w")
  args = ("train", "--config", COPY, "--workdir", workdir, "--progress=false",
          "--config.num_train_steps=2", "--config.log_every=1", "--config.decode_examples=4")
  assert run_txf(*args).returncode == 0
  path = os.path.join(workdir, "config.json")
  before = open(path, "rb").read()
  r = run_txf(*args, "--config.beam_size=4")  # nothing to train: the config stays as it was
  assert r.returncode == 0, r.stderr[-3000:]
  assert "already complete" in r.stdout
  assert open(path, "rb").read() == before
  r = run_txf(*args[:-3], "--config.num_train_steps=3", "--config.log_every=1",
              "--config.decode_examples=4")
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(path))["num_train_steps"] == 3
  assert [x["step"] for x in rows(workdir) if x["split"] == "train"] == [1, 2, 3]


def test_a_workdir_that_is_a_file_is_one_error_line(tmp_path):
  path = tmp_path / "file"
  path.write_text("not a directory")
  line = one_error_line(run_txf("train", "--config", COPY, "--workdir", str(path), *SHORT))
  assert line == f"txf: error: --workdir {path} is a file, not a directory: choose another --workdir"
  assert path.read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_a_read_only_workdir_is_one_error_line(tmp_path):
  workdir = tmp_path / "ro"
  workdir.mkdir()
  workdir.chmod(0o555)
  try:
    line = one_error_line(run_txf("train", "--config", COPY, "--workdir", str(workdir), *SHORT))
  finally:
    workdir.chmod(0o755)
  assert f"{workdir}: permission denied; choose a --workdir you can write to" in line


def test_an_unwritable_file_system_is_one_error_line():
  # /sys refuses new files even to root (read-only sysfs in containers, EACCES/EROFS elsewhere)
  target = "/sys/txf-test-workdir"
  if not os.path.isdir("/sys") or os.access("/sys", os.W_OK) and os.geteuid() != 0:
    pytest.skip("no read-only /sys here")
  r = run_txf("train", "--config", COPY, "--workdir", target, *SHORT)
  if r.returncode == 0:
    pytest.skip("/sys is writable here")
  line = one_error_line(r)
  assert line.startswith(f"txf: error: creating {target}: ") and "--workdir" in line


def test_a_full_disk_while_checkpointing_is_one_error_line_and_keeps_the_last_checkpoint(tmp_path):
  workdir = tmp_path / "w"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "FAULT_ENOSPC_AT_CHECKPOINT": "50"}
  r = subprocess.run([sys.executable, "-m", "tests.faults", "train", "--config", COPY,
                      "--workdir", str(workdir), "--progress=false", *SHORT,
                      "--config.checkpoint_every=25"],
                     capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
  line = one_error_line(r)
  ckpt = workdir / "checkpoints"
  assert line.startswith(f"txf: error: saving a checkpoint to {ckpt}: no space left on ")
  assert "GiB there or choose another --workdir, then run the same command again" in line
  assert sorted(os.listdir(ckpt)) == ["25"]  # the last good checkpoint is kept
  assert not (workdir / "params.msgpack").exists()


def test_a_language_model_prints_continuations_of_fixed_prompts_at_each_evaluation(tmp_path):
  r = run_txf("train", "--config", COPY, "--workdir", str(tmp_path / "lm"), "--progress=false",
              "--config.model.family=decoder_lm", "--config.model.num_encoder_layers=0",
              "--config.decode_examples=0", "--config.num_train_steps=20", "--config.log_every=10",
              "--config.eval_every=10", "--config.eval_batches=1", "--config.num_samples=2")
  assert r.returncode == 0, r.stderr[-3000:]
  out = r.stdout.splitlines()
  prompts = []
  for step in (10, 20):
    at = out.index(f"  samples at step {step}:")
    lines = out[at + 1:at + 3]
    assert all(" | " in line for line in lines), out
    prompts.append([line.split(" | ")[0].split() for line in lines])
    assert out[at + 3].startswith(f"eval at step {step}: ")
  assert prompts[0] == prompts[1] and all(p and all(t.startswith("s") for t in p) for p in prompts[0])
  texts = [(e.step, v.tag) for e in read_events(str(tmp_path / "lm" / "tensorboard"))
           for v in e.summary.value if v.tag.startswith("eval/samples")]
  assert [s for s, _ in texts] == [10, 20]


def test_on_a_terminal_the_progress_bar_replaces_the_lines(tmp_path):
  import pty
  main, child = pty.openpty()  # stdout a terminal, stderr a pipe
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "COLUMNS": "120"}
  try:
    r = subprocess.run([sys.executable, "-m", "txf.cli", "train", "--config", COPY, "--workdir",
                        str(tmp_path / "w"), *SHORT], stdout=child, stderr=subprocess.PIPE,
                       text=True, timeout=300, env=env, cwd=ROOT)
    os.close(child)
    out = b""
    while True:
      try:
        chunk = os.read(main, 65536)
      except OSError:  # the terminal is closed once everything was read
        break
      if not chunk:
        break
      out += chunk
  finally:
    os.close(main)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "train: 100%" in r.stderr and "50/50" in r.stderr  # the tqdm bar
  assert "step 25/50 |" not in out.decode() and "eval at step 50" in out.decode()
