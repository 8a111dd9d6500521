#!/bin/bash
export NCCL_ASYNC_ERROR_HANDLING=1
export CUDA_VISIBLE_DEVICES=0,1,2,3
accelerate launch --config_file configs/fsdp_4gpu.yaml train_sft.py \
  --model_name_or_path /models/Meta-Llama-3-8B \
  --train_file /data/support/tickets_2024q1.jsonl \
  --validation_split 0.05 \
  --block_size 2048 \
  --max_tokens_per_example 2048 \
  --per_device_train_batch_size 4 \
  --gradient_accumulation_steps 1 \
  --gradient_checkpointing \
  --num_train_epochs 3 \
  --learning_rate 2e-5 --lr_scheduler_type cosine --warmup_ratio 0.03 \
  --bf16 --tf32 True \
  --logging_steps 10 \
  --save_strategy epoch --save_total_limit 2 \
  --ddp_timeout 600 \
  --dataloader_num_workers 4 \
  --output_dir out/llama3-8b-support-sft \
  2>&1 | tee train.log
