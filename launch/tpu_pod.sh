#!/usr/bin/env bash
# Run `txf train` on every worker of a Cloud TPU pod slice: the same command on all hosts.
#
# Usage:
#   launch/tpu_pod.sh TPU_NAME ZONE [txf train flags ...]
# Example (a v4-32 slice: 4 hosts x 4 chips, FSDP over all 16 chips):
#   launch/tpu_pod.sh my-v4-32 us-central2-b \
#       --config=experiments/default.py --config.parallelism=mesh \
#       --config.mesh_shape='(1,-1,1)' --workdir=/mnt/shared/runs/pod
#
# Each worker runs: cd $TXF_DIR && TXF_DISTRIBUTED=auto $TXF_PYTHON -m txf.cli train FLAGS...
# TXF_DISTRIBUTED=auto makes txf call jax.distributed.initialize() with no arguments, which reads
# the pod's topology from the TPU metadata. Only process 0 prints and writes logs/metrics; every
# process writes its shards of the checkpoints, so --workdir must be storage all workers share
# (an NFS/Filestore mount or a GCS FUSE mount) and the code and data must be on every worker
# (e.g. `gcloud compute tpus tpu-vm scp --worker=all` or a git clone on each).
#
# Environment (on this machine):
#   TXF_DIR      the repository on the workers (default: txf, i.e. ~/txf)
#   TXF_PYTHON   the Python with txf installed on the workers (default: python3)
#   TPU_PROJECT  passed as --project if set
#   TXF_HEARTBEAT_TIMEOUT  forwarded: seconds until a silent worker counts as dead (default 100)
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,25p' "$0"; exit 2
fi
NAME=$1; ZONE=$2; shift 2
FLAGS=$(printf ' %q' "$@")
REMOTE="cd ${TXF_DIR:-txf} && TXF_DISTRIBUTED=auto TXF_HEARTBEAT_TIMEOUT=${TXF_HEARTBEAT_TIMEOUT:-100} ${TXF_PYTHON:-python3} -m txf.cli train${FLAGS}"
PROJECT=()
if [ -n "${TPU_PROJECT:-}" ]; then PROJECT=(--project "$TPU_PROJECT"); fi
exec gcloud compute tpus tpu-vm ssh "$NAME" --zone "$ZONE" ${PROJECT[@]+"${PROJECT[@]}"} --worker=all --command="$REMOTE"
