#!/bin/bash
# stage 4 only (multi-machine); executed on each of asr-v100-01..04 with node_rank 0..3
. ./path.sh || exit 1;

export CUDA_VISIBLE_DEVICES="0,1,2,3"
export NCCL_DEBUG=INFO
export NCCL_ASYNC_ERROR_HANDLING=1
stage=4
stop_stage=4
num_nodes=4
node_rank=${NODE_RANK:-0}
num_workers=4
prefetch=250

data_type=shard
train_set=train
train_config=conf/train_u2++_conformer.yaml
cmvn=true
dir=exp/u2pp_conformer
checkpoint=
dict=data/dict/lang_char.txt
init_method=tcp://10.12.0.21:23456
dist_backend="nccl"

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
  mkdir -p $dir
  num_gpus=$(echo $CUDA_VISIBLE_DEVICES | awk -F "," '{print NF}')
  world_size=`expr $num_gpus \* $num_nodes`
  echo "total gpus is: $world_size"
  cmvn_opts=
  $cmvn && cp data/${train_set}/global_cmvn $dir
  $cmvn && cmvn_opts="--cmvn ${dir}/global_cmvn"
  for ((i = 0; i < $num_gpus; ++i)); do
  {
    gpu_id=$(echo $CUDA_VISIBLE_DEVICES | cut -d',' -f$[$i+1])
    rank=`expr $node_rank \* $num_gpus + $i`
    python wenet/bin/train.py --gpu $gpu_id \
      --config $train_config \
      --data_type $data_type \
      --symbol_table $dict \
      --train_data data/$train_set/data.list \
      --cv_data data/dev/data.list \
      ${checkpoint:+--checkpoint $checkpoint} \
      --model_dir $dir \
      --ddp.init_method $init_method \
      --ddp.world_size $world_size \
      --ddp.rank $rank \
      --ddp.dist_backend $dist_backend \
      --num_workers ${num_workers} \
      --prefetch ${prefetch} \
      $cmvn_opts \
      --pin_memory
  } &
  done
  wait
fi
