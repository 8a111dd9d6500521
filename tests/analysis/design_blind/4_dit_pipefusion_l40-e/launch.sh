#!/bin/bash
# HunyuanDiT 1.2, 1024px, PipeFusion over all 8 GPUs
export NCCL_DEBUG=INFO
export NCCL_DEBUG_SUBSYS=INIT,NET
torchrun --nproc_per_node=8 --log-dir /scratch/xdit/torchrun_logs --rdzv-id hydit_pp8_7c2e91a0 --redirects 3 \
  examples/hunyuandit_example.py \
  --model /models/HunyuanDiT-v1.2-Diffusers \
  --pipefusion_parallel_degree 8 --ulysses_degree 1 --ring_degree 1 \
  --num_pipeline_patch 8 \
  --height 1024 --width 1024 --no_use_resolution_binning \
  --num_inference_steps 50 --warmup_steps 1 \
  --prompt "an ink painting of a lighthouse in a storm" --seed 42
