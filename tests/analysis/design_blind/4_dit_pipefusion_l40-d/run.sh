#!/bin/bash
set -x
export PYTHONPATH=$PWD:$PYTHONPATH
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
MODEL=/models/stable-diffusion-3-medium-diffusers
torchrun --nproc_per_node=8 ./examples/sd3_example.py \
  --model $MODEL \
  --height 1024 --width 1024 \
  --pipefusion_parallel_degree 8 --ulysses_degree 1 --ring_degree 1 \
  --num_inference_steps 28 --warmup_steps 1 \
  --prompt "a red fox reading a newspaper on a park bench, film photo" \
  --use_cfg_parallel 0 --output_type pil 2>&1 | tee run_sd3_pp8.log
