#!/usr/bin/env bash
# SLURM job: one JAX process per GPU across the allocated nodes (srun starts them; jax.distributed.initialize()
# reads SLURM's environment: coordinator = first node, process id = SLURM_PROCID, count = SLURM_NTASKS).
#
#   sbatch --nodes=2 launch/slurm_gpu.sh configs/ovqa_msrvtt.py /shared/runs/ovqa_msrvtt [--config.field=value ...]
#
# WORKDIR must be on a filesystem every node sees: each process writes its part of every checkpoint, process 0
# the logs. A requeued job (--requeue, preemption) resumes from the newest complete checkpoint in WORKDIR.
# Compile-check first on one GPU node:  python launch/aot_check.py --config=CONFIG --mesh=16x1
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

# One GPU per process: the process sees only its own device. Keep XLA from grabbing all host memory for pinned
# buffers of other processes, and let each process take 90% of its GPU.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

echo "job ${SLURM_JOB_ID}: ${SLURM_NTASKS} processes on ${SLURM_JOB_NUM_NODES} node(s): ${SLURM_JOB_NODELIST}"
srun --kill-on-bad-exit=1 --cpu-bind=none \
  python launch/train.py --distributed --config="${CONFIG}" --workdir="${WORKDIR}" "$@"
