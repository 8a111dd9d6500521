cd /home/wyc/open_clip/src
torchrun --nproc_per_node=8 -m open_clip_train.main \
    --dataset-type csv --csv-separator $'\t' --csv-img-key filepath --csv-caption-key title \
    --train-data /home/wyc/uishots/train_pairs.tsv --val-data /home/wyc/uishots/val_pairs.tsv \
    --model ViT-B-32 --pretrained laion2b_s34b_b79k \
    --batch-size 128 --lr 1e-5 --wd 0.1 --warmup 1000 --epochs 10 --workers 4 \
    --local-loss --gather-with-grad --precision amp --log-every-n-steps 50 \
    2>&1 | tee /home/wyc/train_stdout.log
