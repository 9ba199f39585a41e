#!/usr/bin/env bash
# Run `txf train` on N hosts of a GKE cluster as a JobSet (or through XPK), resumed after a
# preemption.
#
# Usage:
#   launch/gke_jobset.sh [--hosts N] [--image IMAGE] [--name NAME] [--max-restarts R] [--apply] \
#       -- [txf train flags ...]                          # JobSet manifest (printed, or applied)
#   launch/gke_jobset.sh --xpk CLUSTER TPU_TYPE [--num-slices S] [--image IMAGE] [--name NAME] \
#       [--max-restarts R] [--dry-run] -- [txf train flags ...]   # `xpk workload create`
# Examples:
#   launch/gke_jobset.sh --hosts 4 --image us-docker.pkg.dev/p/r/txf:latest -- \
#       --config=experiments/wmt14_en_de_1b.py --workdir=/data/runs/1b | kubectl apply -f -
#   launch/gke_jobset.sh --xpk my-cluster v5p-128 --num-slices 2 --image IMAGE -- \
#       --config=experiments/wmt14_en_de_1b.py --workdir=/data/runs/1b
#
# The manifest: one indexed Job of N pods (one txf process each) behind the JobSet's headless
# service, so pod i is reachable as NAME-workers-0-i.NAME; every pod gets
# TXF_COORDINATOR=NAME-workers-0-0.NAME:PORT, TXF_NUM_PROCESSES=N and TXF_PROCESS_ID=its
# completion index (txf.parallel.distributed). XPK on TPUs: TXF_DISTRIBUTED=auto, and
# jax.distributed.initialize() reads the slice topology from the GKE TPU environment.
# Preemption: the pod gets SIGTERM and terminationGracePeriodSeconds to stop; txf finishes its
# step, writes a checkpoint and (TXF_EXIT_RESUMABLE_ON_SIGNAL=1) exits with 75, a failure, so
# JobSet restarts all pods (up to --max-restarts), which resume from the checkpoint. --workdir
# must be storage every pod mounts (a Filestore volume or a GCS FUSE bucket; add it to the pod
# spec where marked).
set -euo pipefail
usage() { sed -n '2,27p' "$0"; exit 2; }

HOSTS=1; IMAGE=${TXF_IMAGE:-txf:latest}; NAME=txf; RESTARTS=10; APPLY=""; DRY=${TXF_DRY_RUN:-}
XPK=""; CLUSTER=""; TPU_TYPE=""; SLICES=1; PORT=1234
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --image) IMAGE=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --max-restarts) RESTARTS=$2; shift 2 ;;
    --apply) APPLY=1; shift ;;
    --xpk) [ $# -ge 3 ] || usage; XPK=1; CLUSTER=$2; TPU_TYPE=$3; shift 3 ;;
    --num-slices) SLICES=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "gke_jobset.sh: unknown option $1 (txf flags come after --)" >&2; exit 2 ;;
  esac
done
for v in "$HOSTS" "$SLICES" "$RESTARTS"; do
  case "$v" in ''|*[!0-9]*) echo "gke_jobset.sh: --hosts, --num-slices, --max-restarts take integers" >&2; exit 2 ;; esac
done
[ "$HOSTS" -ge 1 ] || { echo "gke_jobset.sh: --hosts must be >= 1" >&2; exit 2; }

FLAGS=("$@")
if [ "$SLICES" -gt 1 ] && [[ " ${FLAGS[*]-} " != *"dcn_mesh_shape"* ]]; then
  FLAGS+=("--config.dcn_mesh_shape=($SLICES,1,1)")
fi
TRAIN="python3 -m txf.cli train$(printf ' %q' "${FLAGS[@]+"${FLAGS[@]}"}")"

if [ -n "$XPK" ]; then
  CMD=(xpk workload create --cluster "$CLUSTER" --workload "$NAME" --tpu-type "$TPU_TYPE"
       --num-slices "$SLICES" --docker-image "$IMAGE" --max-restarts "$RESTARTS"
       --command "TXF_DISTRIBUTED=auto TXF_EXIT_RESUMABLE_ON_SIGNAL=1 $TRAIN")
  if [ -n "$DRY" ]; then printf '%q ' "${CMD[@]}"; echo; else "${CMD[@]}"; fi
  exit 0
fi

# YAML double-quoted string of the train command
QUOTED=$(printf '%s' "$TRAIN" | sed 's/\\/\\\\/g; s/"/\\"/g')
manifest() {
cat <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: $NAME
spec:
  failurePolicy:
    maxRestarts: $RESTARTS          # a preempted or failed pod restarts every pod; txf resumes
  network:
    enableDNSHostnames: true        # pod i of the job: $NAME-workers-0-i.$NAME
  replicatedJobs:
  - name: workers
    replicas: 1
    template:
      spec:
        parallelism: $HOSTS
        completions: $HOSTS
        completionMode: Indexed
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            terminationGracePeriodSeconds: 300   # time to finish the step and write a checkpoint
            containers:
            - name: txf
              image: $IMAGE
              command: ["bash", "-c", "$QUOTED"]
              env:
              - name: TXF_COORDINATOR
                value: "$NAME-workers-0-0.$NAME:$PORT"
              - name: TXF_NUM_PROCESSES
                value: "$HOSTS"
              - name: TXF_PROCESS_ID
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
              - name: TXF_EXIT_RESUMABLE_ON_SIGNAL
                value: "1"
              ports:
              - containerPort: $PORT
              # resources (TPU/GPU limits), nodeSelector and the shared workdir volume go here
EOF
}
if [ -n "$APPLY" ] && [ -z "$DRY" ]; then
  manifest | kubectl apply -f -
else
  manifest
fi
