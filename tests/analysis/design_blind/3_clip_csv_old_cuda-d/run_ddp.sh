#!/bin/bash
source ~/anaconda3/bin/activate clip
export NCCL_DEBUG=INFO
export NCCL_ASYNC_ERROR_HANDLING=1
export OMP_NUM_THREADS=2
python -m torch.distributed.launch --nproc_per_node=4 train_clip.py \
    --train-csv /data/cc3m/cc3m_train.csv --val-csv /data/cc3m/cc3m_val.csv \
    --batch-size 128 --workers 6 --epochs 30 --eval-every 1 \
    --out /data/ckpt/clip_cc3m 2>&1 | tee train_clip_ddp.log
