"""The launchers in launch/: the commands their dry runs print, the JobSet manifest, and the SLURM
script's signal handling and requeue decision end to end (a short copy-task run, no SLURM)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import EXPERIMENTS, ROOT

pytestmark = pytest.mark.slow  # the end-to-end tier: `pytest -m slow` (README, Tests)

LAUNCH = os.path.join(ROOT, "launch")


def run_script(*args, env=None):
  out = subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, **(env or {})))
  assert out.returncode == 0, out.stderr
  return [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]


def test_tpu_pod_dry_run_queued_multislice_runs_detached_on_every_worker():
  lines = run_script(os.path.join(LAUNCH, "tpu_pod.sh"), "--dry-run", "--queued", "v5p-128",
                     "v2-alpha-tpuv5", "--spot", "--num-slices", "2", "my-qr", "us-east5-a",
                     "--config=experiments/wmt14_en_de_1b.py", "--workdir=/mnt/runs/1b")
  create, ssh = lines
  assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "my-qr"]
  for flag, value in (("--node-count", "2"), ("--node-prefix", "my-qr"),
                      ("--accelerator-type", "v5p-128"), ("--runtime-version", "v2-alpha-tpuv5")):
    assert create[create.index(flag) + 1] == value
  assert "--spot" in create
  assert ssh[:6] == ["gcloud", "compute", "tpus", "queued-resources", "ssh", "my-qr"]
  assert "--node=all" in ssh and "--worker=all" in ssh
  remote = [a for a in ssh if a.startswith("--command=")][0][len("--command="):]
  words = shlex.split(remote)
  # detached (new session, SIGHUP ignored), logged per worker, the train flags intact
  assert words[words.index("setsid"):words.index("setsid") + 3] == ["setsid", "nohup", "env"]
  assert "TXF_DISTRIBUTED=auto" in words
  train = words[words.index("txf.cli"):]
  assert train[:4] == ["txf.cli", "train", "--config=experiments/wmt14_en_de_1b.py",
                       "--workdir=/mnt/runs/1b"]
  assert "--config.dcn_mesh_shape=(2,1,1)" in train  # data parallel over the 2 slices
  assert "logs/txf-$(hostname).log" in remote and "logs/txf.pid" in remote
  # each worker's txf runs under the requeue loop (a lost worker's job comes back by itself)
  assert words[words.index("txf.cli") - 4:words.index("txf.cli")] == [
      "bash", "launch/requeue.sh", "python3", "-m"]


def test_tpu_pod_single_slice_and_stop():
  (ssh,) = run_script(os.path.join(LAUNCH, "tpu_pod.sh"), "--dry-run", "my-tpu", "zone-a",
                      "--config.mesh_shape=(1,-1,1)")
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu"]
  assert "dcn_mesh_shape" not in " ".join(ssh)
  (stop,) = run_script(os.path.join(LAUNCH, "tpu_pod.sh"), "--dry-run", "--stop", "my-tpu", "zone-a")
  assert "kill -TERM $(cat logs/txf.pid)" in stop[-1]


def test_tpu_pod_rejects_a_bad_slice_count():
  out = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_pod.sh"), "--dry-run", "--num-slices",
                        "two", "a", "b"], capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and "--num-slices" in out.stderr


def test_jobset_manifest_gives_every_host_the_coordinator_and_restarts():
  out = subprocess.run(["bash", os.path.join(LAUNCH, "gke_jobset.sh"), "--hosts", "4", "--name",
                        "big", "--image", "img:1", "--max-restarts", "5", "--",
                        "--config=experiments/wmt14_en_de_1b.py", "--workdir=/data/runs/1b"],
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  doc = yaml.safe_load(out.stdout)
  assert doc["kind"] == "JobSet" and doc["spec"]["failurePolicy"]["maxRestarts"] == 5
  job = doc["spec"]["replicatedJobs"][0]
  assert job["name"] == "workers"
  assert job["template"]["spec"]["parallelism"] == 4 and job["template"]["spec"]["completionMode"] == "Indexed"
  container = job["template"]["spec"]["template"]["spec"]["containers"][0]
  env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
  assert env["TXF_COORDINATOR"] == "big-workers-0-0.big:1234"  # pod 0 of job "workers"
  assert env["TXF_NUM_PROCESSES"] == "4" and env["TXF_EXIT_RESUMABLE_ON_SIGNAL"] == "1"
  assert "job-completion-index" in env["TXF_PROCESS_ID"]["fieldRef"]["fieldPath"]
  assert shlex.split(container["command"][2]) == ["python3", "-m", "txf.cli", "train",
                                                  "--config=experiments/wmt14_en_de_1b.py",
                                                  "--workdir=/data/runs/1b"]


def test_xpk_dry_run():
  (cmd,) = run_script(os.path.join(LAUNCH, "gke_jobset.sh"), "--xpk", "cl", "v5e-256", "--num-slices",
                      "2", "--dry-run", "--", "--workdir=/data/x")
  assert cmd[:3] == ["xpk", "workload", "create"]
  assert cmd[cmd.index("--tpu-type") + 1] == "v5e-256" and cmd[cmd.index("--num-slices") + 1] == "2"
  words = shlex.split(cmd[cmd.index("--command") + 1])
  assert words[:2] == ["TXF_DISTRIBUTED=auto", "TXF_EXIT_RESUMABLE_ON_SIGNAL=1"]
  assert words[-2:] == ["--workdir=/data/x", "--config.dcn_mesh_shape=(2,1,1)"]


def test_slurm_dry_run():
  srun, requeue = run_script(os.path.join(LAUNCH, "slurm.sbatch"), "--config=experiments/copy.py",
                             env={"TXF_DRY_RUN": "1"})
  assert srun[:2] == ["srun", "--kill-on-bad-exit=1"] and srun[-3:] == ["txf.cli", "train",
                                                                        "--config=experiments/copy.py"]
  text = open(os.path.join(LAUNCH, "slurm.sbatch")).read()
  assert "#SBATCH --signal=B:TERM@120" in text and "#SBATCH --requeue" in text


def _fake_slurm(tmp_path):
  """A PATH with a recording `scontrol`, and a stand-in for txf's Python that waits for SIGTERM
  and then exits with $FAKE_STATUS (what `txf train` does with TXF_EXIT_RESUMABLE_ON_SIGNAL=1)."""
  bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.txt"
  bin_dir.mkdir()
  (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
  (bin_dir / "fake_python").write_text(
      "#!/bin/bash\n[ \"$TXF_EXIT_RESUMABLE_ON_SIGNAL\" = 1 ] || exit 3\n"
      "trap 'exit $FAKE_STATUS' TERM\ntouch \"$FAKE_READY\"\nwhile true; do sleep 0.1; done\n")
  for f in ("scontrol", "fake_python"):
    (bin_dir / f).chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TXF_SRUN="",
             TXF_PYTHON=str(bin_dir / "fake_python"), SLURM_JOB_ID="77", FAKE_READY=str(tmp_path / "ready"))
  return env, calls


@pytest.mark.parametrize("status,requeued", [(75, True), (0, False), (1, False)])
def test_slurm_script_passes_sigterm_on_and_requeues_only_on_75(tmp_path, status, requeued):
  env, calls = _fake_slurm(tmp_path)
  env["FAKE_STATUS"] = str(status)
  proc = subprocess.Popen(["bash", os.path.join(LAUNCH, "slurm.sbatch"), "--workdir=/x"], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 60
  while not (tmp_path / "ready").exists():
    assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)  # SLURM's --signal=B:TERM@120 reaches the batch shell only
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == status, out
  assert calls.exists() == requeued, out
  if requeued:
    assert calls.read_text().split() == ["requeue", "77"] and "requeueing job 77" in out


TRAIN = ["--config", os.path.join(EXPERIMENTS, "copy.py"), "--progress=false",
         "--config.batch_size=8", "--config.model.d_model=16", "--config.model.d_ff=32",
         "--config.model.num_heads=2", "--config.eval_batches=1", "--config.decode_examples=0",
         "--config.num_samples=0", "--config.checkpoint_every=0", "--config.log_every=1"]


@pytest.mark.slow
def test_slurm_script_requeues_only_a_run_stopped_by_sigterm(tmp_path):
  """SLURM's warning signal (SIGTERM to the batch shell) -> txf checkpoints, exits 75 -> the
  script calls `scontrol requeue`; the requeued run resumes and ends with 0, no requeue."""
  bin_dir, calls, workdir = tmp_path / "bin", tmp_path / "scontrol.txt", tmp_path / "run"
  bin_dir.mkdir()
  (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
  (bin_dir / "scontrol").chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TXF_SRUN="", TXF_PYTHON=sys.executable,
             SLURM_JOB_ID="4242", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  env["TXF_DISTRIBUTED"] = "off"   # one process, no SLURM: no jax.distributed
  script = os.path.join(LAUNCH, "slurm.sbatch")
  proc = subprocess.Popen(["bash", script, *TRAIN, "--config.num_train_steps=100000",
                           "--workdir", str(workdir)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 1200
  while not (metrics.exists() and '"train"' in metrics.read_text()):  # step 1 done: it trains
    assert proc.poll() is None, proc.stdout.read()
    if time.time() > deadline:
      proc.kill()
      pytest.fail("the run wrote no train row in 1200 s")
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)  # what --signal=B:TERM@120 does
  out, _ = proc.communicate(timeout=1200)
  assert proc.returncode == 75, out[-3000:]
  assert "requeueing job 4242" in out
  assert calls.read_text().split() == ["requeue", "4242"]
  steps = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert len(steps) == 1 and steps[0] >= 1
  assert not (workdir / "params.msgpack").exists()
  # the requeued job: the same command (here 2 more steps) resumes, finishes, exits 0, no requeue
  done = subprocess.run(["bash", script, *TRAIN, f"--config.num_train_steps={steps[0] + 2}",
                         "--workdir", str(workdir)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=1200)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert f"resumed from the checkpoint at step {steps[0]}" in done.stdout + done.stderr
  assert (workdir / "params.msgpack").exists()
  assert calls.read_text().split() == ["requeue", "4242"]  # not called again
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  assert max(r["step"] for r in rows) == steps[0] + 2


FAKE = """#!/bin/bash
# ends in turn as $FAKE_ENDS says (a status, k9: killed by SIGKILL, term: waits for SIGTERM and
# exits 75 on it, as txf under a requeueing launcher does), and logs each start
n=$(cat "$FAKE_STATE" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE_STATE"
set -- $FAKE_ENDS; shift $n; end=${1:-0}
echo "start $((n + 1)) requeue=$TXF_EXIT_RESUMABLE_ON_SIGNAL"
if [ "$end" = k9 ]; then kill -9 $$; fi
if [ "$end" = term ]; then trap 'kill $! 2>/dev/null; exit 75' TERM; echo waiting; sleep 60 >/dev/null & wait; fi
exit $end
"""


@pytest.mark.parametrize("ends,status,starts", [("75 k9 75 0", 0, 4), ("75 2 0", 2, 2),
                                                ("1", 1, 1), ("75 75 75 75 75", 75, 4)])
def test_requeue_starts_again_on_75_or_a_signal_only(tmp_path, ends, status, starts):
  fake = tmp_path / "fake.sh"
  fake.write_text(FAKE)
  env = dict(os.environ, FAKE_STATE=str(tmp_path / "n"), FAKE_ENDS=ends, TXF_REQUEUE_DELAY="0",
             TXF_REQUEUE_MAX="3")
  env.pop("TXF_EXIT_RESUMABLE_ON_SIGNAL", None)
  r = subprocess.run(["bash", os.path.join(LAUNCH, "requeue.sh"), "bash", str(fake)], env=env,
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == status, r.stderr
  assert r.stdout.splitlines() == [f"start {i + 1} requeue=1" for i in range(starts)], r.stdout


def test_requeue_passes_sigterm_on_and_stops(tmp_path):
  fake = tmp_path / "fake.sh"
  fake.write_text(FAKE)
  env = dict(os.environ, FAKE_STATE=str(tmp_path / "n"), FAKE_ENDS="term 0", TXF_REQUEUE_DELAY="0")
  proc = subprocess.Popen(["bash", os.path.join(LAUNCH, "requeue.sh"), "bash", str(fake)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "start 1 requeue=1\n"
  assert proc.stdout.readline() == "waiting\n"
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=30)
  assert proc.returncode == 75 and out == ""  # the run checkpointed, and was not started again
