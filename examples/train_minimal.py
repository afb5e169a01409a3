"""The training loop a user writes with `vaswani.training`: section 5's recipe in one page, on one process or many
(`accelerate launch examples/train_minimal.py ...`). `vaswani-train` (scripts/train.py) is this loop with every flag,
the progress and logs, and the faults handled.

    python examples/train_minimal.py DATASET_DIR TOKENIZER_DIR OUTPUT_DIR [--max_steps 200] [--preset tiny]

DATASET_DIR is a translation DatasetDict (scripts/prepare_data.py), TOKENIZER_DIR a shared tokenizer
(scripts/train_tokenizer.py). Run it again with a higher --max_steps: it resumes from its last checkpoint.
"""

import argparse
import time
from pathlib import Path

from transformers import AutoTokenizer

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.checks import tokenizer_ids
from vaswani.training import (
    PairCollator,
    TokenBucketSampler,
    TrainingRun,
    inverse_sqrt_schedule,
    load_translation_dataset,
    pair_loader,
    tokenize_split,
    train_step,
    validate,
)
from vaswani.training.distributed import launch_accelerator, main_process_first
from vaswani.training.step import recipe_adam


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset_dir")
    parser.add_argument("tokenizer")
    parser.add_argument("output_dir")
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--save_steps", type=int, default=50)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch_tokens", type=int, default=2000)
    args = parser.parse_args()
    # The launched strategy (one process, DDP over GPUs or CPU cores, FSDP, DeepSpeed), checked to be what was asked.
    accelerator = launch_accelerator(args.output_dir, step_scheduler_with_optimizer=False)  # our schedule: per step

    # Data (section 5.1): pairs tokenized once into Arrow, batches of about --batch_tokens tokens of similar length.
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    dataset = load_translation_dataset(args.dataset_dir, "en", "es")
    with main_process_first(accelerator):  # the main process tokenizes, the others then read its cache
        train, valid = (tokenize_split(dataset[split], tokenizer, "en", "es") for split in ("train", "validation"))
    config = VaswaniConfig.from_preset(args.preset, **tokenizer_ids(tokenizer))
    collator = PairCollator(config.pad_token_id, config.decoder_start_token_id)
    shard = {"num_replicas": accelerator.num_processes, "rank": accelerator.process_index}
    train_batches = TokenBucketSampler(train.source_lengths, train.target_lengths, args.batch_tokens, **shard)
    valid_batches = TokenBucketSampler(
        valid.source_lengths, valid.target_lengths, args.batch_tokens, shuffle=False, drop_remainder=False, **shard
    )
    train_loader = pair_loader(train, train_batches, collator)
    valid_loader = pair_loader(valid, valid_batches, collator)

    # The run: afresh, or from its last checkpoint (the same model and settings, checked).
    run = TrainingRun(args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, average_last=3)
    config, checkpoint = run.config_and_checkpoint(config, tokenizer, resume_from_checkpoint="latest")

    # Model, Adam and the warmup-then-inverse-square-root schedule (section 5.3).
    model = VaswaniForConditionalGeneration(config)
    optimizer = recipe_adam(accelerator, model.parameters())
    scheduler = inverse_sqrt_schedule(optimizer, warmup_steps=50, peak_lr=1e-3)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    settings = {"preset": args.preset, "batch_tokens": args.batch_tokens, "processes": accelerator.num_processes}
    state = run.start(accelerator, settings, seed=0, checkpoint=checkpoint)
    batches = run.step_batches(train_loader, state, gradient_accumulation_steps=1)

    # The loop (sections 5.2-5.4): one optimizer step per batch, label smoothing 0.1, validation and checkpoints.
    model.train()
    while state.step < args.max_steps:
        started = time.perf_counter()
        result = train_step(accelerator, model, optimizer, scheduler, next(batches), label_smoothing=0.1)
        state.add_step(result, time.perf_counter() - started)
        if state.step % args.save_steps == 0:
            scores = validate(accelerator, accelerator.unwrap_model(model), valid_loader)
            accelerator.print(
                f"step {state.step}: loss {result.loss / result.target_tokens:.3f}, validation {scores['val_loss']:.3f}"
            )
        run.save_if_due(accelerator, model, config, state, result)

    # Section 6.1: the final model is the average of the last checkpoints.
    final_model, averaged = run.average(accelerator, config)
    if accelerator.is_main_process:
        final_model.save_pretrained(Path(args.output_dir) / "final")
        tokenizer.save_pretrained(Path(args.output_dir) / "final")
    accelerator.print(f"final model: the average of {', '.join(path.name for path in averaged)}")


if __name__ == "__main__":
    main()
