#!/usr/bin/env bash
# The main job, on a fresh Debian-like machine with 2 CPU cores, in about 20 minutes or more (docs/benchmarks/main_job/
# records its training and test decoding times): install, build the English-Spanish Bible corpus, train the shared
# BPE vocabulary, train the `small` model with the paper's recipe on a schedule that suits a few hundred steps,
# average its last checkpoints, score test BLEU with the paper's beam search, and
# draw the positional encoding and the attention of one sentence.
#
# Everything lands in $OUT (default outputs/main_job): data/, tokenizer/, model/ (loads with from_pretrained and
# holds training_curves.png, lr_schedule.png, the attention and positional-encoding pictures,
# training_summary.json, eval_results.json): ready for scripts/push_to_hub.py.
# Knobs: OUT, STEPS (700), PRESET (small), TEST_SAMPLES (all; a number for the first N test sentences, scored as a
# partial run into partial_eval_results.json).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-outputs/main_job}
STEPS=${STEPS:-700}
PRESET=${PRESET:-small}
TEST_SAMPLES=${TEST_SAMPLES:-all}
mkdir -p "$OUT"
start=$(date +%s)
stage() { echo; echo "=== [$(( $(date +%s) - start ))s] $*"; }

stage "install (torch 2.13.0 first, then vaswani)"
bash scripts/install.sh train,data

stage "data: verse-aligned World English Bible / Reina-Valera 1909 (scripts/prepare_data.py)"
python3 scripts/prepare_data.py --output_dir "$OUT/data"

stage "tokenizer: one byte-pair encoding shared by both languages, 8000 tokens (section 5.1)"
python3 scripts/train_tokenizer.py --dataset_dir "$OUT/data" --vocab_size 8000 --output_dir "$OUT/tokenizer"

# Two data-parallel processes of one thread each use both cores better than one process of two threads. Without a
# GPU, `--multi_gpu` is what starts real gloo ranks (`--cpu --num_processes 2` silently starts one).
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    launch=(accelerate launch --num_processes 1 --mixed_precision bf16)
else
    cores=$(nproc)
    launch=(accelerate launch --multi_gpu --num_processes $(( cores >= 2 ? 2 : 1 )) --num_machines 1
            --mixed_precision no --dynamo_backend no)
    export OMP_NUM_THREADS=1
fi
stage "training: $PRESET preset, $STEPS steps, warmup then inverse square root peaking at 1e-3 (scripts/train.py)"
[ -d "$OUT/model" ] && echo "replacing the earlier run in $OUT/model" && rm -rf "$OUT/model"
"${launch[@]}" scripts/train.py --dataset_dir "$OUT/data" --tokenizer "$OUT/tokenizer" --preset "$PRESET" \
    --output_dir "$OUT/model" --max_steps "$STEPS" --batch_tokens 2000 \
    --lr_schedule short --peak_lr 1e-3 --warmup_steps 130 \
    --save_steps 50 --average_last 5 --eval_steps 200 --eval_bleu_samples 100 --logging_steps 10
unset OMP_NUM_THREADS

stage "test BLEU with the paper's decoding: beam 4, length penalty 0.6 (scripts/evaluate_bleu.py)"
samples=()
[ "$TEST_SAMPLES" != all ] && samples=(--max_samples "$TEST_SAMPLES")
python3 scripts/evaluate_bleu.py --model "$OUT/model" --dataset_dir "$OUT/data" --split test "${samples[@]}" \
    --num_examples 5

stage "pictures: positional encoding and attention of one sentence (scripts/visualize.py)"
python3 scripts/visualize.py --model "$OUT/model" --text "In the beginning, God created the heavens and the earth." \
    --output_dir "$OUT/model"

stage "done in $(( $(date +%s) - start ))s: model, plots and pictures in $OUT/model"
