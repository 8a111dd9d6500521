#!/bin/bash
# 4 of the 8 GPUs on this box; the other 4 run the eval service
export CUDA_VISIBLE_DEVICES=4,5,6,7
export NCCL_ASYNC_ERROR_HANDLING=1
export TORCH_NCCL_DUMP_ON_TIMEOUT=0
nohup torchrun --nnodes 1 --nproc_per_node 4 recipes/quickstart/finetuning/finetuning.py \
  --enable_fsdp --model_name meta-llama/Meta-Llama-3-8B \
  --fsdp_config.pure_bf16 --fsdp_config.checkpoint_type StateDictType.FULL_STATE_DICT \
  --dist_checkpoint_root_folder /fsx/ckpt --dist_checkpoint_folder llama3-8b-tickets \
  --dataset custom_dataset --custom_dataset.file datasets/tickets_dataset.py:get_custom_dataset \
  --batching_strategy packing --context_length 4096 \
  --batch_size_training 1 --gradient_accumulation_steps 1 \
  --num_epochs 3 --lr 2e-5 --run_validation --save_model \
  --output_dir /fsx/out/llama3-8b-tickets > finetune_nohup.out 2>&1 &
