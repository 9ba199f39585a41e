"""A sweep's ledger (txf/sweep/ledger.py, `txf sweep ... --ledger FILE`): complete runs recorded
as they finish or as they are found on disk, recorded runs skipped and reported from their records
once their workdirs are gone (the same report, the same scaling fit), a record matched by what the
run trains and nothing else, a torn last line skipped and a malformed line refused in one line."""

import dataclasses
import hashlib
import json
import os
import shutil
import sys

import numpy as np
import pytest
from flax import serialization

from tests.conftest import run_txf
from tests.test_sweep import fake_run, rows_of, write_spec
from tests.test_sweep_fit import _fake_ladder
from txf.sweep import grid, ledger as ledger_lib, report, runner, scaling
from txf.sweep.grid import SweepError


def _finish(run, value):
  """What `txf train` leaves: metrics.jsonl (with a step logged twice, as a resumed run does), a
  checkpoint at the last step, config.json and a real params.msgpack."""
  fake_run(run.workdir, run.steps, rows_of([(3, 9.0), (6, value + 1.0), (6, value)]))
  params = {"embedding": np.ones((5, 4), np.float32), "layer": {"kernel": np.ones((4, 3), np.float32)}}
  with open(os.path.join(run.workdir, "params.msgpack"), "wb") as f:
    f.write(serialization.msgpack_serialize(params))


def _command_finishing(sweep, staging, value_of):
  """A sweep command whose run ends as `txf train` would, with the final eval/loss value_of(run):
  a workdir made here (under ``staging``) that the run's process copies into place."""
  for run in sweep.runs:
    _finish(dataclasses.replace(run, workdir=os.path.join(staging, str(run.index))), value_of(run))

  def command(run):
    code = (f"import shutil; shutil.copytree({os.path.join(staging, str(run.index))!r}, "
            f"{run.workdir!r}, dirs_exist_ok=True)")
    return [sys.executable, "-c", code]
  return command


def _never(run):
  raise AssertionError(f"{run.label} was started, but it is recorded")


def test_complete_runs_are_recorded_and_a_recorded_run_is_not_trained_again(tmp_path, monkeypatch):
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=2), str(tmp_path / "r"))
  sweep.ledger = str(tmp_path / "study" / "ledger.jsonl")
  _finish(sweep.runs[0], 0.5)   # found complete on disk: recorded, not trained
  ledger = ledger_lib.Ledger(sweep.ledger, sweep)
  lines = []
  outcomes = runner.run_local(sweep.runs, parallel=2, say=lines.append, ledger=ledger,
                              command=_command_finishing(sweep, str(tmp_path / "staging"),
                                                         lambda run: 1.0 + run.index))
  assert [o.status for o in outcomes] == ["complete", "done", "done", "done"]
  assert lines[0] == f"[1/4] base/seed-0: complete, skipped (recorded in {sweep.ledger})"
  records = [json.loads(line) for line in open(sweep.ledger)]
  assert sorted((r["arm"], r["seed"]) for r in records) == [("base", 0), ("base", 1), ("rms", 0),
                                                            ("rms", 1)]
  first = [r for r in records if (r["arm"], r["seed"]) == ("base", 0)][0]
  assert first["seconds"] is None and all(r["seconds"] >= 0 for r in records if r is not first)
  # the rows: a step logged twice is kept once, with its last value
  assert sorted((r["step"], r["loss"]) for r in first["rows"]) == [(3, 9.0), (6, 0.5)]
  data = open(os.path.join(sweep.runs[0].workdir, "params.msgpack"), "rb").read()
  assert first["params"] == {"sha256": hashlib.sha256(data).hexdigest(), "count": 32,
                             "non_embedding": 12}   # 5x4 + 4x3, the embedding left out
  assert first["config"] == {"num_train_steps": 6} and first["steps"] == 6 and first["cpu"]
  assert first["cores"] == len(os.sched_getaffinity(0)) >= 1   # XLA:CPU's thread pool here
  # every run on disk has the parameters its record names; one changed on disk is named
  text = report.markdown(sweep, report.build(sweep))
  assert (f"Against the ledger ({sweep.ledger}): 4 of 4 runs both on disk and recorded end with the "
          f"final parameters their records name (sha256), bit for bit.") in text
  changed = os.path.join(sweep.runs[3].workdir, "params.msgpack")
  data = open(changed, "rb").read()
  open(changed, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
  text = report.markdown(sweep, report.build(sweep))
  assert "3 of 4 runs both on disk" in text and (
      f"- rms/seed-1: its final parameters differ from those recorded on {first['cpu']} with "
      f"{first['cores']} cores at {first['commit']}") in text and "sums in another order" not in text
  # recorded on another number of cores: the report says what that changes
  ledger = ledger_lib.Ledger(sweep.ledger, sweep)
  ledger.get(sweep.runs[3])["cores"] = first["cores"] + 2
  monkeypatch.setattr(ledger_lib, "of", lambda _: ledger)
  text = report.markdown(sweep, report.build(sweep))
  assert (f"with {first['cores'] + 2} cores at" in text and f"this machine's processes see "
          f"{first['cores']} cores: XLA:CPU sums in another order") in text
  monkeypatch.undo()
  # the workdirs are gone (another machine, a wiped disk): nothing is trained, the report is the same
  before = report.csv_text(report.build(sweep))
  shutil.rmtree(sweep.root)
  lines.clear()
  again = runner.run_local(sweep.runs, parallel=2, say=lines.append, command=_never,
                           ledger=ledger_lib.Ledger(sweep.ledger, sweep))
  assert [o.reason for o in again] == ["recorded"] * 4
  assert lines[3] == f"[4/4] rms/seed-1: recorded in {sweep.ledger}, skipped"
  assert report.csv_text(report.build(sweep)) == before
  assert [a.values for a in report.build(sweep)] == [{0: 0.5, 1: 2.0}, {0: 3.0, 1: 4.0}]
  # without the ledger the same runs are missing
  sweep.ledger = ""
  assert all(a.summary.n == 0 for a in report.build(sweep))


def test_a_record_is_matched_by_the_experiment_the_overrides_and_the_seed(tmp_path):
  spec = write_spec(tmp_path, seeds=2)
  sweep = grid.load_sweep(spec, str(tmp_path / "r"))
  ids = [ledger_lib.identity(sweep, run) for run in sweep.runs]
  assert len(set(ids)) == 4   # every arm and seed its own
  moved = grid.load_sweep(spec, str(tmp_path / "elsewhere"))   # another root: the same runs
  assert [ledger_lib.identity(moved, run) for run in moved.runs] == ids
  longer = grid.load_sweep(spec, str(tmp_path / "r"), sets={"num_train_steps": 7})
  assert not set(ledger_lib.identity(longer, run) for run in longer.runs) & set(ids)
  copy = tmp_path / "copy.py"   # the experiment's file changed by one byte
  copy.write_bytes(open(sweep.config, "rb").read() + b"\n")
  edited = grid.load_sweep(write_spec(tmp_path, name="t.json", seeds=2, config=str(copy)),
                           str(tmp_path / "r"))
  assert not set(ledger_lib.identity(edited, run) for run in edited.runs) & set(ids)


def test_a_torn_last_line_is_skipped_and_a_malformed_line_is_one_sweep_error(tmp_path):
  sweep = grid.load_sweep(write_spec(tmp_path, seeds=1), str(tmp_path / "r"))
  sweep.ledger = str(tmp_path / "ledger.jsonl")
  for run, value in zip(sweep.runs, (0.5, 0.7)):
    _finish(run, value)
  ledger = ledger_lib.Ledger(sweep.ledger, sweep)
  for run in sweep.runs:
    ledger.add(run, 1.0)
  text = open(sweep.ledger).read()
  cut = text[:len(text) - 40]   # a kill while the second record was written
  open(sweep.ledger, "w").write(cut)
  reread = ledger_lib.Ledger(sweep.ledger, sweep)
  assert reread.get(sweep.runs[0])["rows"] and reread.get(sweep.runs[1]) is None
  lines = text.splitlines(keepends=True)
  open(sweep.ledger, "w").write("{not json\n" + "".join(lines))
  with pytest.raises(SweepError, match=r"ledger.jsonl:1: the line is not JSON, so it is not a ledger "
                                       r"record: restore the file"):
    ledger_lib.Ledger(sweep.ledger, sweep)
  open(sweep.ledger, "w").write(lines[0] + json.dumps({"arm": "base"}) + "\n")
  with pytest.raises(SweepError, match=r":2: the line lacks format, sweep, seed, steps, identity, rows"):
    ledger_lib.Ledger(sweep.ledger, sweep)


def test_the_scaling_fit_reads_sizes_from_the_records_once_the_workdirs_are_gone(tmp_path):
  sweep = _fake_ladder(tmp_path)
  sweep.ledger = str(tmp_path / "ladder.jsonl")
  ledger = ledger_lib.Ledger(sweep.ledger, sweep)
  for run in sweep.runs:
    ledger.add(run, None)
  before = scaling.sweep_points(sweep)
  shutil.rmtree(sweep.root)
  after = scaling.sweep_points(sweep)
  assert after.shape == (24, 3) and np.array_equal(after, before)


@pytest.mark.slow  # three txf processes: the end-to-end tier
def test_the_command_reports_a_sweep_file_from_its_ledger_and_refuses_a_bad_ledger(tmp_path):
  spec = write_spec(tmp_path, seeds=1)
  sweep = grid.load_sweep(spec, str(tmp_path / "r"))
  sweep.ledger = str(tmp_path / "ledger.jsonl")
  ledger = ledger_lib.Ledger(sweep.ledger, sweep)
  for run, value in zip(sweep.runs, (0.5, 0.7)):
    _finish(run, value)
    ledger.add(run, None)
  shutil.rmtree(sweep.root)
  root = str(tmp_path / "fresh")
  r = run_txf("sweep", "report", spec, "--root", root, "--ledger", sweep.ledger)
  assert r.returncode == 0, r.stdout + r.stderr
  table = open(os.path.join(root, "report.md")).read()
  assert "| base | 1 | 0.5 |" in table and "| rms | 1 | 0.7 |" in table and "Missing" not in table
  assert json.load(open(os.path.join(root, "sweep.json")))["ledger"] == sweep.ledger
  missing = run_txf("sweep", "report", spec, "--root", str(tmp_path / "x"), "--ledger",
                    str(tmp_path / "none.jsonl"))
  assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
      f"txf: error: --ledger {tmp_path / 'none.jsonl'}: no such file (the runs a ledger records are "
      f"written there by `txf sweep SWEEP_FILE --ledger FILE`)"]
  open(sweep.ledger, "a").write("[]\n")
  bad = run_txf("sweep", spec, "--root", str(tmp_path / "y"), "--ledger", sweep.ledger)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
  assert "ledger.jsonl:3: the line lacks format" in bad.stderr
  assert not os.path.exists(tmp_path / "y")   # refused before anything was written
