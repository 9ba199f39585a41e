#!/usr/bin/env bash
# Run `txf train` on every worker of a Cloud TPU slice (or of N slices), detached: the run goes on
# after this script and its SSH sessions end, each worker logs to its own file, and running the
# same command again resumes the run from its last checkpoint.
#
# Usage:
#   launch/tpu_pod.sh [options] NAME ZONE [txf train flags ...]
# Options:
#   --queued TYPE VERSION  first create the TPU as a queued resource NAME (accelerator TYPE, e.g.
#                          v5p-128, runtime VERSION, e.g. v2-alpha-tpuv5) and wait until it is ACTIVE
#   --spot                 with --queued: a spot (preemptible) queued resource
#   --num-slices N         multislice: N slices of one queued resource (needs --queued, or an existing
#                          multislice queued resource NAME); adds --config.dcn_mesh_shape='(N,1,1)'
#                          (data parallel across slices) unless the flags set dcn_mesh_shape
#   --stop                 send SIGTERM to the run on every worker: it checkpoints and exits
#   --logs                 show the last lines of worker 0's log
#   --dry-run              print the gcloud commands instead of running them (also TXF_DRY_RUN=1)
# Example (a v4-32 slice: 4 hosts x 4 chips, FSDP over all 16 chips):
#   launch/tpu_pod.sh my-v4-32 us-central2-b \
#       --config=experiments/default.py --config.parallelism=mesh \
#       --config.mesh_shape='(1,-1,1)' --workdir=/mnt/shared/runs/pod
#
# Each worker runs, in $TXF_DIR:
#   setsid nohup env TXF_DISTRIBUTED=auto ... bash launch/requeue.sh $TXF_PYTHON -m txf.cli train FLAGS \
#       > logs/txf-HOST.log
# in the background and returns: nohup makes the run ignore SIGHUP (the end of the SSH session),
# setsid takes it out of the session's process group. launch/requeue.sh starts `txf train` again
# whenever it ends with status 75 (a lost or hung worker, a full disk: txf.core.errors) or by a
# signal (kill -9, the OOM killer), so a job whose worker died comes back on every worker and
# resumes from its last checkpoint by itself; 0, 1 and 2 end it. SIGTERM (from --stop, or a
# maintenance event) reaches requeue.sh, which passes it to txf (it finishes its step, writes a
# checkpoint and exits) and does not start it again. The loop's pid is in logs/txf.pid. TXF_DISTRIBUTED=auto makes txf call jax.distributed.initialize() with no
# arguments, which reads the topology (and the slices of a multislice queued resource) from the
# TPU metadata. Only process 0 prints and writes logs/metrics; every process writes its shards of
# the checkpoints, so --workdir must be storage all workers share (an NFS/Filestore mount or a
# GCS FUSE mount) and the code and data must be on every worker (e.g. `gcloud compute tpus tpu-vm
# scp --worker=all` or a git clone on each). After a preemption, run the same command again (with
# --queued it waits for the resource to come back): txf resumes from the last checkpoint.
#
# Environment (on this machine):
#   TXF_DIR      the repository on the workers (default: txf, i.e. ~/txf)
#   TXF_PYTHON   the Python with txf installed on the workers (default: python3)
#   TPU_PROJECT  passed as --project if set
#   TXF_HEARTBEAT_TIMEOUT  forwarded: seconds until a silent worker counts as dead (default 100)
set -euo pipefail
usage() { sed -n '2,44p' "$0"; exit 2; }

DRY=${TXF_DRY_RUN:-}; QUEUED=""; TYPE=""; VERSION=""; SPOT=""; SLICES=1; MODE=run
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --queued) [ $# -ge 3 ] || usage; QUEUED=1; TYPE=$2; VERSION=$3; shift 3 ;;
    --spot) SPOT=1; shift ;;
    --num-slices) [ $# -ge 2 ] || usage; SLICES=$2; shift 2 ;;
    --num-slices=*) SLICES=${1#*=}; shift ;;
    --stop) MODE=stop; shift ;;
    --logs) MODE=logs; shift ;;
    -h|--help) usage ;;
    --*) echo "tpu_pod.sh: unknown option $1 (options come before NAME ZONE)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || usage
NAME=$1; ZONE=$2; shift 2
case "$SLICES" in ''|*[!0-9]*|0) echo "tpu_pod.sh: --num-slices must be a positive integer" >&2; exit 2 ;; esac

PROJECT=()
if [ -n "${TPU_PROJECT:-}" ]; then PROJECT=(--project "$TPU_PROJECT"); fi
# print (dry run) or run one command
run() {
  if [ -n "$DRY" ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

FLAGS=("$@")
if [ "$SLICES" -gt 1 ] && [[ " ${FLAGS[*]-} " != *"dcn_mesh_shape"* ]]; then
  FLAGS+=("--config.dcn_mesh_shape=($SLICES,1,1)")
fi

# SSH to every worker: a multislice or queued resource through `queued-resources ssh --node=all`
if [ -n "$QUEUED" ] || [ "$SLICES" -gt 1 ]; then
  SSH=(gcloud compute tpus queued-resources ssh "$NAME" --zone "$ZONE" ${PROJECT[@]+"${PROJECT[@]}"} --node=all --worker=all)
else
  SSH=(gcloud compute tpus tpu-vm ssh "$NAME" --zone "$ZONE" ${PROJECT[@]+"${PROJECT[@]}"} --worker=all)
fi
DIR=${TXF_DIR:-txf}

case "$MODE" in
  stop)
    run "${SSH[@]}" --command="cd $DIR && if [ -f logs/txf.pid ]; then kill -TERM \$(cat logs/txf.pid) 2>/dev/null || true; fi"
    exit 0 ;;
  logs)
    SSH0=("${SSH[@]/--worker=all/--worker=0}"); SSH0=("${SSH0[@]/--node=all/--node=0}")
    run "${SSH0[@]}" --command="cd $DIR && tail -n 50 logs/txf-\$(hostname).log"
    exit 0 ;;
esac

if [ -n "$QUEUED" ]; then
  NODES=(--node-id "$NAME")
  if [ "$SLICES" -gt 1 ]; then NODES=(--node-count "$SLICES" --node-prefix "$NAME"); fi
  SPOT_FLAG=()
  if [ -n "$SPOT" ]; then SPOT_FLAG=(--spot); fi
  DESCRIBE=(gcloud compute tpus queued-resources describe "$NAME" --zone "$ZONE" ${PROJECT[@]+"${PROJECT[@]}"} --format='value(state.state)')
  # create it unless it exists (a relaunch after a preemption reuses it)
  if [ -n "$DRY" ] || ! "${DESCRIBE[@]}" >/dev/null 2>&1; then
    run gcloud compute tpus queued-resources create "$NAME" --zone "$ZONE" ${PROJECT[@]+"${PROJECT[@]}"} \
        "${NODES[@]}" --accelerator-type "$TYPE" --runtime-version "$VERSION" ${SPOT_FLAG[@]+"${SPOT_FLAG[@]}"}
  fi
  if [ -z "$DRY" ]; then
    until [ "$("${DESCRIBE[@]}")" = "ACTIVE" ]; do
      echo "tpu_pod.sh: waiting for queued resource $NAME to be ACTIVE (now: $("${DESCRIBE[@]}"))"; sleep 60
    done
  fi
fi

TRAIN=$(printf ' %q' "${FLAGS[@]+"${FLAGS[@]}"}")
REMOTE="cd $DIR && mkdir -p logs && setsid nohup env TXF_DISTRIBUTED=auto \
TXF_HEARTBEAT_TIMEOUT=${TXF_HEARTBEAT_TIMEOUT:-100} bash launch/requeue.sh ${TXF_PYTHON:-python3} -m txf.cli train${TRAIN} \
> logs/txf-\$(hostname).log 2>&1 < /dev/null & echo \$! > logs/txf.pid; \
echo \"\$(hostname): txf train started (pid \$(cat logs/txf.pid)), log: $DIR/logs/txf-\$(hostname).log\""
run "${SSH[@]}" --command="$REMOTE"
