#!/bin/bash
#SBATCH --job-name=pt-1b3
#SBATCH --partition=a100
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=96
#SBATCH --time=48:00:00
#SBATCH --output=slurm-%j.out

set -euo pipefail
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
export MASTER_PORT=29500
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=INIT
export NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3
echo "START $(date +%FT%T)  job=$SLURM_JOB_ID  nodes=$SLURM_JOB_NODELIST"
echo "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT NNODES=$SLURM_NNODES GPUS_PER_NODE=8"
python3 -c 'import torch; print("torch", torch.__version__, " nccl", torch.cuda.nccl.version())'

srun -l torchrun \
  --nnodes=$SLURM_NNODES --nproc-per-node=8 \
  --rdzv-id=$SLURM_JOB_ID --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT \
  --log-dir=/home/kpatel/torchrun_logs/$(hostname) --redirects=3 \
  train_fsdp2.py --config configs/pretrain_1b3.yaml
