#!/usr/bin/env bash
# SLURM job: one JAX process per GPU across the allocated nodes (srun starts them; jax.distributed.initialize()
# reads SLURM's environment: coordinator = first node, process id = SLURM_PROCID, count = SLURM_NTASKS).
#
#   sbatch --nodes=2 launch/slurm_gpu.sh configs/ovqa_msrvtt.py /shared/runs/ovqa_msrvtt [--config.field=value ...]
#
# SCRIPT=launch/evaluate.py runs the evaluate-only entry instead (add --checkpoint=last|best|STEP). WORKDIR (and the
# data and pretrained paths) may be gs:// URIs (the nodes need Google credentials, e.g. a service account).
# WORKDIR must be on a filesystem every node sees: each process writes its part of every checkpoint, process 0
# the logs. A requeued job (--requeue, preemption) resumes from the newest complete checkpoint in WORKDIR.
# Install once on the shared filesystem: python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[gpu]'
# (jax[cuda12] 0.10.2, gcsfs for gs:// paths). Compile-check first on one GPU node (its 8 GPUs, same overrides):
#   python launch/aot_check.py --config=CONFIG --mesh=8x1 [--config.field=value ...]
# DRY_RUN=1 runs nothing: it prints, for every process srun would start, its node, the SLURM variables from which
# jax.distributed.initialize() takes its process id and coordinator, and its command. Outside an allocation give the
# nodes and the job id:  DRY_RUN=1 DRY_RUN_NODES=gpu01,gpu02 SLURM_JOB_ID=1234 bash launch/slurm_gpu.sh CONFIG WORKDIR
#SBATCH --job-name=evqa-jax
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail

CONFIG=${1:?usage: sbatch launch/slurm_gpu.sh CONFIG WORKDIR [--config.field=value ...]}
WORKDIR=${2:?usage: sbatch launch/slurm_gpu.sh CONFIG WORKDIR [--config.field=value ...]}
shift 2

REPO_DIR=${REPO_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}
cd "${REPO_DIR}"
if [[ -f .venv/bin/activate ]]; then . .venv/bin/activate; fi
CMD=(python "${SCRIPT:-launch/train.py}" --distributed --config="${CONFIG}" --workdir="${WORKDIR}" "$@")

if [[ "${DRY_RUN:-0}" == "1" ]]; then
  if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then
    mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST}")
  else
    IFS=, read -r -a nodes <<< "${DRY_RUN_NODES:?DRY_RUN=1 outside an allocation needs DRY_RUN_NODES=node1,node2,...}"
  fi
  per_node=${SLURM_NTASKS_PER_NODE:-8}  # the #SBATCH default above
  ntasks=$(( ${#nodes[@]} * per_node ))
  # jax._src.clusters.slurm_cluster: the first node, port 61440 + job id mod 4096; srun's default block
  # distribution puts processes [k * per_node, (k + 1) * per_node) on node k.
  port=$(( 61440 + ${SLURM_JOB_ID:?DRY_RUN=1 needs SLURM_JOB_ID} % 4096 ))
  echo "local: srun --kill-on-bad-exit=1 --cpu-bind=none $(printf '%q ' "${CMD[@]}")"
  for ((k = 0; k < ${#nodes[@]}; k++)); do
    for ((l = 0; l < per_node; l++)); do
      echo "node ${nodes[k]}: SLURM_PROCID=$(( k * per_node + l )) SLURM_LOCALID=${l} SLURM_NTASKS=${ntasks}" \
        "coordinator=${nodes[0]}:${port}: $(printf '%q ' "${CMD[@]}")"
    done
  done
  exit 0
fi

# One GPU per process: the process sees only its own device. Keep XLA from grabbing all host memory for pinned
# buffers of other processes, and let each process take 90% of its GPU.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

echo "job ${SLURM_JOB_ID}: ${SLURM_NTASKS} processes on ${SLURM_JOB_NUM_NODES} node(s): ${SLURM_JOB_NODELIST}"
srun --kill-on-bad-exit=1 --cpu-bind=none "${CMD[@]}"
