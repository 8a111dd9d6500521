#!/bin/bash
#SBATCH -J sb-conformer
#SBATCH -p v100
#SBATCH -N 4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=8
#SBATCH --mem=0
#SBATCH -t 3-00:00:00
#SBATCH -o slurm-%j.out

export MASTER=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=INIT,NET
echo "JOB $SLURM_JOB_ID on $SLURM_JOB_NODELIST  MASTER=$MASTER:29400  nodes=$SLURM_NNODES gpus/node=4"
cd /home/sbuser/speechbrain/recipes/LibriSpeech/ASR/transformer
srun -l torchrun --nnodes=$SLURM_NNODES --nproc_per_node=4 \
    --rdzv_backend=c10d --rdzv_endpoint=$MASTER:29400 --rdzv_id=$SLURM_JOB_ID \
    train.py hparams/conformer_medium.yaml \
    --data_folder /datasets/LibriSpeech --precision fp16 --noprogressbar False
