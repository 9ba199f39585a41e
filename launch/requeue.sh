#!/usr/bin/env bash
# Run a command again each time it ends with status 75 or is killed by a signal, as a scheduler
# that requeues does (SLURM with --requeue, a TPU queued resource, a JobSet's restarts): the loop
# each worker of a pod runs around `txf train` (launch/tpu_pod.sh starts it there).
#
# Usage:
#   launch/requeue.sh COMMAND [ARGS ...]
#   launch/requeue.sh python3 -m txf.cli train --config=experiments/copy.py --workdir=runs/copy
#
# 75 is txf's EXIT_RESUMABLE (txf.core.errors): the run stopped before its end with its last
# checkpoint intact (a lost or hung process of the job, a preemption notice, a full disk), so the
# same command resumes it. A status above 128 is a death by a signal (kill -9, the OOM killer):
# the last checkpoint is intact too. Any other status ends the loop with it: 0 finished, 1 a bug,
# 2 bad input (those need a hand). This script sets TXF_EXIT_RESUMABLE_ON_SIGNAL=1, so that a run
# stopped by a signal says 75, not 0.
#
# SIGTERM or SIGINT to this script (launch/tpu_pod.sh --stop) is passed to the command, which
# checkpoints and exits, and ends the loop. Environment:
#   TXF_REQUEUE_MAX    most restarts (default 100), then the last status is returned
#   TXF_REQUEUE_DELAY  seconds between an end and the next start (default 5)
set -u
[ $# -ge 1 ] || { sed -n '2,23p' "$0"; exit 2; }
export TXF_EXIT_RESUMABLE_ON_SIGNAL=1
EXIT_RESUMABLE=75
MAX=${TXF_REQUEUE_MAX:-100}
DELAY=${TXF_REQUEUE_DELAY:-5}
STOP=""
CHILD=""
trap 'STOP=1; if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; fi' TERM INT
RESTARTS=0
while :; do
  "$@" &
  CHILD=$!
  if [ -n "$STOP" ]; then kill -TERM "$CHILD" 2>/dev/null; fi  # a signal that came before $! was known
  wait "$CHILD"
  STATUS=$?
  while kill -0 "$CHILD" 2>/dev/null; do  # wait returns early when the trap runs: wait again
    wait "$CHILD"
    STATUS=$?
  done
  CHILD=""
  if [ -n "$STOP" ] || { [ "$STATUS" != "$EXIT_RESUMABLE" ] && [ "$STATUS" -le 128 ]; }; then
    exit "$STATUS"
  fi
  if [ "$RESTARTS" -ge "$MAX" ]; then
    echo "requeue.sh: ended with status $STATUS after $RESTARTS restarts (TXF_REQUEUE_MAX): giving up" >&2
    exit "$STATUS"
  fi
  RESTARTS=$((RESTARTS + 1))
  echo "requeue.sh: ended with status $STATUS: starting it again (restart $RESTARTS)" >&2
  sleep "$DELAY" &
  wait $!
  if [ -n "$STOP" ]; then exit "$STATUS"; fi
done
