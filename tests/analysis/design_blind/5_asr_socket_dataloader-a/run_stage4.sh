#!/bin/bash
# run.sh stage 4 (excerpt)
. ./path.sh
export NCCL_DEBUG=INFO
export NCCL_SOCKET_IFNAME=eth0
num_nodes=4
node_rank=$1
num_gpus=4
world_size=$((num_nodes * num_gpus))
dir=exp/conformer_16gpu
for ((i = 0; i < num_gpus; ++i)); do
  rank=$((node_rank * num_gpus + i))
  python wenet/bin/train.py --gpu $i --config conf/train_conformer.yaml --data_type raw \
    --symbol_table data/dict/lang_char.txt --train_data data/train/data.list --cv_data data/dev/data.list \
    --model_dir $dir --ddp.init_method tcp://10.12.0.11:29611 --ddp.world_size $world_size --ddp.rank $rank \
    --ddp.dist_backend nccl --num_workers 4 --prefetch 250 --pin_memory --cmvn $dir/global_cmvn \
    > $(hostname)/rank${rank}.log 2>&1 &
done
wait
