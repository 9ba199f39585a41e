"""A workdir is enough: translate / classify / generate / eval on runs whose training data has moved.

Three tiny runs train once per module on local text (``text:`` sources, parallel / tsv / plain)
under a temporary directory; then the text folders and the prepared tfds data are moved away,
TXF_DATA is unset and TXF_DATA_DIR points at an empty folder. The commands run as subprocesses
(exit status, stdout and stderr apart); their answers are checked against the task training built
from the data (``txf.data.make_task``), computed before the data moved.
"""

import json
import os
import pty
import select
import shutil
import stat
import subprocess
import sys

import pytest

from test_data_fixtures import config_for, parallel_dir, plain_dir, sentences, tsv_dir
from txf import decode, inference
from txf.commands import terminal
from txf.runtime import workdir as workdir_lib
from txf.data import make_task
from txf.data.saved import point_at_data
from txf.core.errors import TxfError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


pytestmark = pytest.mark.slow   # three tiny runs trained once (~1-2 min), then ~10 s per command


def _tiny(cfg, steps=4):
  cfg.model.update(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                   dropout_rate=0.0, max_len=32)
  cfg.update(num_train_steps=steps, batch_size=8, eval_every=0, checkpoint_every=0, eval_batches=0,
             decode_examples=0, num_samples=0, log_every=steps)
  return cfg


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
  """{family: workdir} of three runs whose data was moved to ``moved/`` after training, the
  expected answers computed from the data before it moved, and the environment without the data."""
  root = tmp_path_factory.mktemp("workdir_only")
  prepared = root / "tfds"     # data.data_dir "": TXF_DATA_DIR decides, as for most users
  specs = {
      "encoder_decoder": config_for(f"text:{parallel_dir(root / 'data' / 'par')}", "",
                                    test_split="test"),
      "encoder_classifier": config_for(f"text:{tsv_dir(root / 'data' / 'tsv')}", "",
                                       "encoder_classifier", "tsv", eval_split="dev",
                                       test_split="dev"),
      "decoder_lm": config_for(f"text:{plain_dir(root / 'data' / 'plain')}", "", "decoder_lm",
                               "plain", tokenizer="char"),
  }
  runs, expected = {}, {}
  queries = sentences(5, seed=7)[0]
  before = os.environ.get("TXF_DATA_DIR")
  os.environ["TXF_DATA_DIR"] = str(prepared)
  try:
    _train_all(specs, root, runs, expected, queries)
  finally:
    if before is None:
      os.environ.pop("TXF_DATA_DIR")
    else:
      os.environ["TXF_DATA_DIR"] = before
  shutil.move(str(root / "data"), str(root / "moved"))
  shutil.rmtree(prepared)
  return {"runs": runs, "expected": expected, "queries": queries, "moved": str(root / "moved")}


def _train_all(specs, root, runs, expected, queries):
  from txf.train import train
  for family, cfg in specs.items():
    workdir = str(root / "runs" / family)
    train(_tiny(cfg), workdir)
    runs[family] = workdir
    task = make_task(workdir_lib.load_config(workdir), workdir)   # the training path, data present
    if family == "encoder_decoder":
      run = inference.load_run(workdir)
      expected[family] = [task.decode_target(i) for i in decode.translate_ids(
          run.model_cfg, run.params, [task.encode_source(q) for q in queries], task.max_input_len,
          decode.decode_buffer_len(run.model_cfg, task, 5), decode.DecodingSpec(max_extra=5), 4)]
      expected["val"] = [r["source"] for r in task.records("val")]


def _env(data_dir):
  """This environment without TXF_DATA, with TXF_DATA_DIR=data_dir (where data gets prepared)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TXF_DATA_DIR": str(data_dir)}
  env.pop("TXF_DATA", None)
  return env


def _txf(data_dir, *args, stdin=None):
  return subprocess.run([sys.executable, "-m", "txf.cli", *args], input=stdin, capture_output=True,
                        text=True, env=_env(data_dir), cwd=ROOT, timeout=300)


def _error_line(result):
  assert result.returncode == 2, (result.returncode, result.stderr)
  lines = [l for l in result.stderr.splitlines() if l.startswith("txf: error:")]
  assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
  return lines[0]


def test_translate_needs_only_the_workdir(moved, tmp_path):
  text = "".join(q + "\n" for q in moved["queries"])
  result = _txf(tmp_path, "translate", f"--workdir={moved['runs']['encoder_decoder']}", "--max_extra=5",
                "--batch_size=4", stdin=text)
  assert result.returncode == 0, result.stderr
  # nothing but results on stdout: one line per input line, equal to the training task's decoding
  assert result.stdout.splitlines() == moved["expected"]["encoder_decoder"]
  assert os.listdir(tmp_path) == []            # nothing was prepared: the data was never read


def test_classify_needs_only_the_workdir(moved, tmp_path):
  result = _txf(tmp_path, "classify", f"--workdir={moved['runs']['encoder_classifier']}",
                stdin="a dog runs\n\nthe cat sleeps\n")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.split("\n")[:-1]
  assert len(lines) == 3 and lines[1] == "", result.stdout
  for line in (lines[0], lines[2]):
    label, prob = line.split("\t")
    assert label in ("0", "1") and 0.5 <= float(prob) <= 1.0


def test_eval_without_its_data_names_data_path_finds_it_there_and_shows_progress(moved, tmp_path):
  workdir = moved["runs"]["encoder_decoder"]
  result = _txf(tmp_path, "eval", f"--workdir={workdir}")
  assert "--data_path" in _error_line(result) and result.stdout == ""
  # no test split in the data: the eval split is scored; progress after every batch on stderr
  out = tmp_path / "r.json"
  result = _txf(tmp_path, "eval", f"--workdir={workdir}", f"--data_path={moved['moved']}",
                f"--output={out}", "--max_extra=5", "--batch_size=16", "--progress_every=0")
  assert result.returncode == 0, result.stderr
  report = json.loads(out.read_text())
  n = len(moved["expected"]["val"])                       # 40 sentences: 3 batches of 16
  assert report["split"] == "val" and report["num_examples"] == n
  assert json.loads(result.stdout) == report              # stdout is the report and nothing else
  progress = [l for l in result.stderr.splitlines() if l.startswith("txf eval:")]
  assert [l.split(",")[0] for l in progress] == [
      "txf eval: scoring 1/3 batches", "txf eval: scoring 2/3 batches", "txf eval: scoring 3/3 batches",
      f"txf eval: decoding 16/{n} sentences", f"txf eval: decoding 32/{n} sentences",
      f"txf eval: decoding {n}/{n} sentences"]
  result = _txf(tmp_path, "eval", f"--workdir={workdir}", f"--data_path={moved['moved']}",
                "--split=test")
  line = _error_line(result)
  assert "'test'" in line and "--data_path" in line


def test_data_path_is_the_folder_or_the_root_that_holds_it(moved, tmp_path, monkeypatch):
  monkeypatch.setenv("TXF_DATA_DIR", str(tmp_path))
  for where in (os.path.join(moved["moved"], "par"), moved["moved"]):
    run = inference.load_run(moved["runs"]["encoder_decoder"], data_path=where)
    assert [e.source for e in run.task.examples("val", 40)] == moved["expected"]["val"]
  config = workdir_lib.load_config(moved["runs"]["encoder_decoder"])
  with pytest.raises(TxfError, match="no such directory"):
    point_at_data(config, os.path.join(moved["moved"], "nowhere"))


def test_progress_is_silent_when_short_and_throttled_when_long():
  lines, now = [], [0.0]

  class Out:
    def write(self, s):
      lines.append(s)

    def flush(self):
      pass

  quiet = terminal.Progress(after_s=5, every_s=10, stream=Out(), clock=lambda: now[0])
  for i in range(1, 4):
    now[0] = i
    quiet("decoding", i, 3, "sentences")
  assert lines == []
  now[0] = 0.0
  slow = terminal.Progress(after_s=5, every_s=10, stream=Out(), clock=lambda: now[0])
  for i in range(1, 21):                                   # one batch every 2 s
    now[0] = 2.0 * i
    slow("decoding", i, 20, "sentences")
  shown = [l for l in lines if l.strip()]
  assert shown == ["txf eval: decoding 3/20 sentences, 6 s", "txf eval: decoding 8/20 sentences, 16 s",
                   "txf eval: decoding 13/20 sentences, 26 s", "txf eval: decoding 18/20 sentences, 36 s",
                   "txf eval: decoding 20/20 sentences, 40 s"]


# Root writes into read-only directories, so for root the child runs txf with os.open refusing to
# create or write files under TEST_READ_ONLY_DIR, as the kernel does for other users.
READ_ONLY_AS_ROOT = """
import errno, os, runpy, sys
read_only, real_open = os.environ.pop("TEST_READ_ONLY_DIR") + os.sep, os.open
def refusing_open(path, flags, *args, **kwargs):
  if os.path.abspath(path).startswith(read_only) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
  return real_open(path, flags, *args, **kwargs)
os.open = refusing_open
runpy.run_module("txf.cli", run_name="__main__")
"""


def test_eval_refuses_a_read_only_run_before_evaluating(moved, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(moved["runs"]["encoder_decoder"], run)
  os.chmod(run, 0o555)
  env = {**_env(tmp_path / "tfds"), "TEST_READ_ONLY_DIR": run, "TXF_MALLOC": "system"}  # no re-exec
  head = ["-c", READ_ONLY_AS_ROOT] if os.geteuid() == 0 else ["-m", "txf.cli"]

  def txf(*args):
    return subprocess.run([sys.executable, *head, "eval", f"--workdir={run}",
                           f"--data_path={moved['moved']}", "--max_extra=5", "--progress_every=0",
                           *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)

  try:
    result = txf()
    line = _error_line(result)
    assert "--output" in line and os.path.join(run, "eval_val.json") in line, line
    assert result.stdout == "" and "txf eval: scoring" not in result.stderr   # nothing evaluated
    out = tmp_path / "elsewhere" / "r.json"
    result = txf(f"--output={out}")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["split"] == "val"
    assert sorted(os.listdir(run)) == sorted(os.listdir(moved["runs"]["encoder_decoder"]))
  finally:
    os.chmod(run, stat.S_IRWXU)


def _read_line(fd, timeout=120.0) -> str:
  """One line from a pipe, waiting at most ``timeout`` seconds for it."""
  got = b""
  while not got.endswith(b"\n"):
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, f"no answer within {timeout} s (got {got!r})"
    chunk = os.read(fd, 1)
    assert chunk, f"stdout closed (got {got!r})"
    got += chunk
  return got.decode("utf-8").rstrip("\n")


def test_translate_on_a_terminal_answers_each_line_as_it_is_typed(moved, tmp_path):
  master, slave = pty.openpty()
  proc = subprocess.Popen([sys.executable, "-m", "txf.cli", "translate",
                           f"--workdir={moved['runs']['encoder_decoder']}", "--max_extra=5"],
                          stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=_env(tmp_path), cwd=ROOT)
  os.close(slave)
  try:
    expected = moved["expected"]["encoder_decoder"]
    for query, answer in zip(moved["queries"][:2], expected):
      os.write(master, (query + "\n").encode())
      assert _read_line(proc.stdout.fileno()) == answer     # before the next line is typed
    os.write(master, b"\x04")                                 # Ctrl-D
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert proc.stdout.read() == b""
  finally:
    if proc.poll() is None:
      proc.kill()
    os.close(master)


def test_generate_samples_prompts_of_different_lengths_together(moved, tmp_path):
  prompts = ["SPEAKER 1", "", "the dog"]
  flags = ["--seed=3", "--num_samples=2", "--temperature=1.0", "--max_new_tokens=6"]
  result = _txf(tmp_path, "generate", f"--workdir={moved['runs']['decoder_lm']}",
                *[f"--prompt={p}" for p in prompts], *flags)
  assert result.returncode == 0, result.stderr
  run = inference.load_run(moved["runs"]["decoder_lm"])
  want = []
  for p, prompt in enumerate(prompts, 1):
    # alone, through the same-length sampler (one key, row s drawing with fold_in(key, s))
    spec = decode.DecodingSpec(temperature=1.0, top_p=0.95)
    alone = inference.sample_texts(run, prompt, 6, spec, seed=3, num_samples=2)
    assert alone == inference.sample_prompts(run, [prompt], 6, spec, 3, 2)[0]
    for s, text in enumerate(alone, 1):
      assert text.startswith(prompt)
      want += [f"--- prompt {p}, sample {s}", text]
  assert result.stdout == "".join(line + "\n" for line in want)   # the texts may hold newlines
  assert len({t for t in want if not t.startswith("---")}) > len(prompts)   # samples differ
