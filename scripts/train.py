"""Train the Transformer with the recipe of "Attention Is All You Need", section 5, through Hugging Face Accelerate.

The loop below follows the paper: 5.1 batches of about --batch_tokens tokens (vaswani.training.data), 5.2 one
optimizer step per batch, 5.3 Adam with the warmup-then-inverse-square-root learning rate (vaswani.training.schedule),
5.4 dropout and label smoothing, 6.1 the last checkpoints averaged into the final model (vaswani.training.checkpoints).

  python scripts/train.py --dataset_dir DIR --tokenizer TOK --preset small --output_dir OUT --max_steps 1000
  accelerate launch [--config_file configs/multi_gpu.yaml] scripts/train.py ...      (configs/README.md)
  vaswani-train ... --output_dir OUT --resume          continue a stopped run exactly where it stopped

SIGTERM or SIGINT finishes the step under way, checkpoints and exits with 143 / 130, printing the command that
resumes; a non-finite loss skips its step (docs/reliability.md). OUT receives checkpoints/, logs/ (TensorBoard),
train_log.jsonl, and at the end the averaged model with its tokenizer, training_curves.png, lr_schedule.png and
training_summary.json.
"""

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from accelerate.utils import DistributedType, gather_object, set_seed
from tqdm.auto import tqdm

from vaswani import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration, label_smoothed_cross_entropy
from vaswani.configuration.configuration_vaswani import INIT_SCHEMES
from vaswani.training.batching import TokenBucketSampler
from vaswani.training.checkpoints import (
    TRAIN_STATE_FILE,
    TrainState,
    average_checkpoints,
    check_checkpoint_fits,
    is_interim,
    list_checkpoints,
    load_weights_into,
    remove_leftovers,
    save_checkpoint,
    settings_changes,
    weights_checksum,
)
from vaswani.training.checks import UsageError, check_tokenizer_matches_config, check_writable_dir, tokenizer_ids
from vaswani.training.cli import command, parse_arguments
from vaswani.training.data import (
    PairCollator,
    load_translation_dataset,
    pair_loader,
    tokenize_split,
    tokenizer_fingerprint,
)
from vaswani.training.distributed import LaunchedStrategy, configure_deepspeed, describe, shard_shared_embedding
from vaswani.training.evaluation import validate
from vaswani.training.faults import StopSignal, check_free_space, non_finite_loss_message, resume_command
from vaswani.training.hub import PushError, push_to_hub
from vaswani.training.records import append_jsonl, hardware_description, read_jsonl, write_plots
from vaswani.training.schedule import SCHEDULES, inverse_sqrt_schedule, peak_lr_of
from vaswani.training.tokenizer import load_tokenizer


# accelerate warns at every save that it leaves out the tied copies of the shared embedding (section 3.4); that is
# intended, and load_weights_into() checks that nothing else is missing.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)

# The arguments that decide the sequence of steps: which batches, in which order, with which random streams, learning
# rates and updates. A resumed run continues exactly only with the values its checkpoint was written with.
STEP_SETTINGS = (
    "batch_tokens",
    "grad_accum",
    "seed",
    "preset",
    "dropout",
    "attention_dropout",
    "source_lang",
    "target_lang",
    "max_source_length",
    "max_target_length",
    "long_pairs",
    "lr_schedule",
    "warmup_steps",
    "lr_scale",
    "peak_lr",
    "adam_beta1",
    "adam_beta2",
    "adam_eps",
    "label_smoothing",
    "max_grad_norm",
)
# The architecture a checkpoint was trained with must be the one this command builds.
ARCHITECTURE = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "dropout",
    "attention_dropout",
)


@dataclass
class TrainArguments:
    """The defaults are the paper's base model on 8 GPUs (Table 3, sections 5.1-5.4); the README and
    configs/README.md give the flags for a small run on a CPU."""

    # Data (section 5.1).
    dataset_dir: str = field(metadata={"help": "DatasetDict saved by scripts/prepare_data.py"})
    tokenizer: str = field(metadata={"help": "tokenizer folder saved by scripts/train_tokenizer.py"})
    output_dir: str = field(metadata={"help": "checkpoints, logs, and at the end the averaged model"})
    source_lang: str = "en"
    target_lang: str = "es"
    max_source_length: int = field(default=256, metadata={"help": "longest source, in tokens with </s>"})
    max_target_length: int = field(default=256, metadata={"help": "longest target, in tokens with </s>"})
    long_pairs: Literal["filter", "truncate"] = field(
        default="filter", metadata={"help": "what to do with training pairs longer than the maximum lengths"}
    )
    batch_tokens: int = field(
        default=6250,
        metadata={"help": "padded source+target tokens per batch and process (paper: 25000+25000 over 8 GPUs)"},
    )
    grad_accum: int = field(
        default=1,
        metadata={"help": "batches accumulated into one optimizer step, to reach the paper's tokens per step"},
    )
    num_proc: int = field(
        default=min(os.cpu_count() or 1, 16),
        metadata={"help": "processes that tokenize the corpus the first time (the result is cached next to it)"},
    )
    dataloader_num_workers: int = field(
        default=0,
        metadata={
            "help": "processes that read and pad the next batches while the model trains (a GPU wants 2 or more; on a "
            "CPU they compete with training for the cores)"
        },
    )
    # Model (Table 3).
    preset: Literal[tuple(sorted(PRESETS))] = "base"
    dropout: float | None = field(default=None, metadata={"help": "P_drop (section 5.4); default: the preset's"})
    attention_dropout: float | None = field(default=None, metadata={"help": "default: the config's (0)"})
    init_scheme: Literal[tuple(INIT_SCHEMES)] | None = field(
        default=None, metadata={"help": "how the new model's weights are drawn (INIT_SCHEMES); default: the config's"}
    )
    # Optimizer and schedule (sections 5.2, 5.3, 5.4).
    max_steps: int = field(default=100_000, metadata={"help": "optimizer steps (base: 100k, big: 300k)"})
    lr_schedule: Literal[SCHEDULES] = field(
        default="paper",
        metadata={
            "help": "paper: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); short: the same shape scaled to peak at "
            "--peak_lr, for runs of a few hundred steps"
        },
    )
    warmup_steps: int = 4000
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the paper schedule"})
    peak_lr: float = field(default=1e-3, metadata={"help": "peak of the short schedule"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    label_smoothing: float = field(default=0.1, metadata={"help": "epsilon_ls (section 5.4)"})
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "clip gradients to this norm; 0: off, as in the paper"}
    )
    seed: int = 0
    max_bad_steps: int = field(
        default=10,
        metadata={"help": "stop after this many steps in a row with a non-finite loss (each is skipped: no update)"},
    )
    # Hardware.
    mixed_precision: Literal["no", "bf16", "fp16"] | None = field(
        default=None, metadata={"help": "default: what `accelerate launch` / the accelerate config says (else no)"}
    )
    cpu: bool = field(default=False, metadata={"help": "train on the CPU even if a GPU is present"})
    ddp_timeout: int = field(
        default=1800,
        metadata={
            "help": "seconds a process waits for the others, e.g. while the main process tokenizes the corpus the first "
            "time (as transformers' TrainingArguments.ddp_timeout)"
        },
    )
    # Checkpoints and output (section 6.1).
    save_every: int = field(default=1000, metadata={"help": "steps between checkpoints"})
    keep_checkpoints: int = field(default=5, metadata={"help": "how many recent checkpoints to keep"})
    average_last: int = field(
        default=5,
        metadata={"help": "average the last K checkpoints into the final model (paper: 5 base, 20 big); 1: none"},
    )
    resume: str | None = field(
        default=None,
        metadata={
            "nargs": "?",
            "const": "latest",
            "help": "continue from the latest complete checkpoint in OUTPUT_DIR (or from this folder)",
        },
    )
    resume_with_changes: bool = field(
        default=False,
        metadata={
            "help": "resume although settings that decide the steps (batches, data, random streams, learning rates) "
            "differ from the checkpoint's; the run then no longer continues exactly"
        },
    )
    push_to_hub: bool = field(default=False, metadata={"help": "at the end, upload the final model (one commit)"})
    hub_model_id: str | None = field(default=None, metadata={"help": "NAMESPACE/NAME of the Hub repo"})
    hub_private_repo: bool = field(default=False, metadata={"help": "create the Hub repo as private"})
    # Validation and logs.
    eval_every: int = field(default=1000, metadata={"help": "steps between validations; 0: only at the end"})
    eval_bleu_samples: int = field(default=500, metadata={"help": "BLEU on the first N validation pairs; 0: none"})
    eval_num_beams: int = field(default=1, metadata={"help": "1: greedy decoding; 4: the paper's beam"})
    eval_length_penalty: float = 0.6
    eval_batch_size: int = field(default=64, metadata={"help": "sentences per generate() call"})
    log_every: int = field(default=50, metadata={"help": "steps between training-loss log lines"})
    report_to: Literal["tensorboard", "none"] = "tensorboard"
    # For the tests of --resume: checkpoint and stop after this step, as if killed there.
    stop_after: int | None = field(default=None, metadata={"help": argparse.SUPPRESS})

    def __post_init__(self):
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id NAMESPACE/NAME")
        for name in (
            "batch_tokens",
            "grad_accum",
            "max_steps",
            "warmup_steps",
            "save_every",
            "keep_checkpoints",
            "average_last",
            "log_every",
            "eval_num_beams",
            "eval_batch_size",
            "max_source_length",
            "max_target_length",
            "max_bad_steps",
            "num_proc",
            "ddp_timeout",
        ):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UsageError("--label_smoothing must be in [0, 1)")
        if self.dataloader_num_workers < 0:
            raise UsageError("--dataloader_num_workers must be at least 0")


def model_config(args, tokenizer):
    """A preset of Table 3 with the tokenizer's vocabulary size and special ids."""
    overrides = tokenizer_ids(tokenizer)
    overrides.update(
        {
            name: getattr(args, name)
            for name in ("dropout", "attention_dropout", "init_scheme")
            if getattr(args, name) is not None
        }
    )
    config = VaswaniConfig.from_preset(args.preset, **overrides)
    longest = max(args.max_source_length, args.max_target_length) + 51  # decoding runs to source length + 50
    # Sinusoidal encodings (section 3.5): no weight depends on this limit.
    config.max_position_embeddings = max(config.max_position_embeddings, longest)
    return config


def checkpoint_to_resume(args, checkpoint_root, config, tokenizer):
    """The checkpoint --resume names (or None to start afresh) and its config, checked against this command's."""
    candidates = list_checkpoints(checkpoint_root) if args.resume == "latest" else [Path(args.resume)]
    if args.resume != "latest" and not (candidates[0] / TRAIN_STATE_FILE).is_file():
        raise UsageError(f"--resume {args.resume} is not a complete checkpoint (no {TRAIN_STATE_FILE}).")
    if not candidates:
        return None, config
    checkpoint = candidates[-1]
    if not (checkpoint / "config.json").is_file():
        raise UsageError(f"checkpoint {checkpoint} has no config.json; it cannot be resumed.")
    saved = VaswaniConfig.from_json_file(str(checkpoint / "config.json"))
    check_tokenizer_matches_config(tokenizer, saved, f"checkpoint {checkpoint}")
    for name in ARCHITECTURE:
        if getattr(saved, name) != getattr(config, name):
            raise UsageError(
                f"checkpoint {checkpoint} was trained with {name}={getattr(saved, name)}, but this "
                f"command asks for {getattr(config, name)}; resume with the original --preset/--dropout."
            )
    check_checkpoint_fits(checkpoint, VaswaniForConditionalGeneration, saved)
    return checkpoint, saved


def bucket_sampler(split, name, args, accelerator, **options):
    try:
        return TokenBucketSampler(
            split.source_lengths,
            split.target_lengths,
            args.batch_tokens,
            num_replicas=accelerator.num_processes,
            rank=accelerator.process_index,
            **options,
        )
    except ValueError as error:
        raise UsageError(f"--batch_tokens {args.batch_tokens}, {name} split: {error}") from error


@command
def main(argv):
    (args,) = parse_arguments([TrainArguments], argv, description=__doc__.split("\n\n")[0])
    wall_start = time.time()
    # --- Checks that would otherwise fail hours later, before any process group starts. ---
    output_dir = check_writable_dir(args.output_dir)
    checkpoint_root = output_dir / "checkpoints"
    if args.resume is None and list_checkpoints(checkpoint_root):
        raise UsageError(
            f"{checkpoint_root} already holds checkpoints of an earlier run; pass --resume to continue "
            "it, or choose another --output_dir."
        )
    dataset = load_translation_dataset(args.dataset_dir, args.source_lang, args.target_lang)
    tokenizer = load_tokenizer(args.tokenizer)
    config = model_config(args, tokenizer)
    resume_from = None
    if args.resume is not None:
        resume_from, config = checkpoint_to_resume(args, checkpoint_root, config, tokenizer)
        if resume_from is None and int(os.environ.get("RANK", "0")) == 0:
            print(f"--resume: no checkpoint in {checkpoint_root} yet, starting from scratch.")
    keep = max(args.keep_checkpoints, args.average_last)
    check_free_space(output_dir, VaswaniForConditionalGeneration, config, keep, len(list_checkpoints(checkpoint_root)))

    # Accelerate picks up what `accelerate launch` set: processes, DDP / FSDP / DeepSpeed, precision; the run gets
    # that strategy or stops here saying why (vaswani.training.distributed).
    strategy = LaunchedStrategy.from_environment(cpu=args.cpu)
    accelerator = strategy.accelerator(
        output_dir,
        args.ddp_timeout,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.grad_accum,
        step_scheduler_with_optimizer=False,  # our schedule steps once per optimizer step, whatever the process count
        log_with=None if args.report_to == "none" else args.report_to,
    )
    strategy.check(accelerator)
    main_process, say = accelerator.is_main_process, accelerator.print
    say(f"strategy: {describe(accelerator)}")

    # --- Data (section 5.1), tokenized once into Arrow next to the dataset. The main process tokenizes first; then
    # the first process of every other machine, which finds the files on a shared file system or else builds its
    # machine's own copy; then all the others, which map the files. ---
    train = valid = None
    for my_turn in (accelerator.is_main_process, accelerator.is_local_main_process, True):
        if my_turn and train is None:
            train, valid = (
                tokenize_split(
                    dataset[split],
                    tokenizer,
                    args.source_lang,
                    args.target_lang,
                    args.max_source_length,
                    args.max_target_length,
                    long_pairs,
                    num_proc=args.num_proc,
                )
                for split, long_pairs in (("train", args.long_pairs), ("validation", "truncate"))
            )
        accelerator.wait_for_everyone()
    if not len(train):
        raise UsageError(
            f"no training pair fits --max_source_length {args.max_source_length} / --max_target_length "
            f"{args.max_target_length} ({train.without_text} of them are not text)."
        )
    if not len(valid):
        raise UsageError("the validation split has no pair with text on both sides.")
    sampler = bucket_sampler(train, "training", args, accelerator, seed=args.seed, batches_per_step=args.grad_accum)
    valid_sampler = bucket_sampler(valid, "validation", args, accelerator, shuffle=False, drop_remainder=False)
    steps_per_epoch = sampler.batches_in_epoch(0) // args.grad_accum
    if steps_per_epoch == 0:
        raise UsageError(
            f"the training split makes fewer batches of --batch_tokens {args.batch_tokens} than "
            f"processes x --grad_accum ({accelerator.num_processes} x {args.grad_accum}); lower "
            "--batch_tokens or --grad_accum."
        )
    collator = PairCollator(config.pad_token_id, config.decoder_start_token_id)
    train_loader = pair_loader(train, sampler, collator, num_workers=args.dataloader_num_workers)
    valid_loader = pair_loader(valid, valid_sampler, collator)
    bleu_rows = valid.rows[: args.eval_bleu_samples].tolist()
    bleu_texts = dataset["validation"].select(bleu_rows)["translation"] if bleu_rows else []
    bleu_pairs = ([pair[args.source_lang] for pair in bleu_texts], [pair[args.target_lang] for pair in bleu_texts])
    say(
        f"train: {len(train)} pairs ({train.too_long} longer than the maximum lengths dropped, {train.truncated} "
        f"truncated, {train.without_text} without text dropped); validation: {len(valid)} pairs "
        f"({valid.without_text} without text dropped); tokenized "
        + ("earlier, read from the cache" if train.from_cache else "now and cached")
        + " next to the dataset"
    )
    tokens_per_step = args.batch_tokens * args.grad_accum * accelerator.num_processes
    say(
        f"batches of <= {args.batch_tokens} padded tokens x {args.grad_accum} accumulated x "
        f"{accelerator.num_processes} processes = <= {tokens_per_step} tokens per optimizer step (paper: ~25000 "
        f"source + ~25000 target); {steps_per_epoch} steps per epoch"
    )

    # --- Model, optimizer and schedule (section 5.3). ---
    set_seed(args.seed)  # the same initial weights on every process
    model = VaswaniForConditionalGeneration(config)
    shard_shared_embedding(accelerator, model)
    say(
        f"model: preset {args.preset}, {model.num_parameters() / 1e6:.1f}M parameters, d_model {config.d_model}, "
        f"dropout {config.dropout}, vocabulary {config.vocab_size}"
    )
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps
    )
    peak_lr = peak_lr_of(args.lr_schedule, config.d_model, args.warmup_steps, args.lr_scale, args.peak_lr)
    scheduler = inverse_sqrt_schedule(optimizer, args.warmup_steps, peak_lr)
    configure_deepspeed(accelerator, args.max_grad_norm)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.gradient_accumulation_steps != args.grad_accum:
        raise UsageError(
            f"the accelerate config accumulates {accelerator.gradient_accumulation_steps} batches but "
            f"--grad_accum is {args.grad_accum}; make them agree."
        )

    # --- Where to start: step 0, or exactly where a checkpoint left off. ---
    settings = {
        **{name: getattr(args, name) for name in STEP_SETTINGS},
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        "dataset": dataset["train"]._fingerprint,
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }
    state = TrainState(settings=settings)
    log_path = output_dir / "train_log.jsonl"
    set_seed(args.seed, device_specific=True)  # a different dropout stream on each process
    if resume_from is not None:
        saved = TrainState.read(resume_from)
        changes = settings_changes(saved.settings, settings)
        if changes and not args.resume_with_changes:
            raise UsageError(
                f"checkpoint {resume_from} was written with other settings that decide the steps: "
                + "; ".join(changes)
                + ". Resume with those, or pass --resume_with_changes to continue "
                "anyway (the run is then no longer the one an uninterrupted run would have been)."
            )
        if changes:
            say("warning: resuming with changed settings (--resume_with_changes): " + "; ".join(changes))
        try:  # weights, Adam moments, schedule, every process's RNG states
            accelerator.load_state(str(resume_from))
        except Exception as error:  # a damaged file, or a pickle holding more than tensors (read with weights_only)
            raise UsageError(f"cannot load checkpoint {resume_from} ({type(error).__name__}: {error}).") from error
        state = TrainState(**{**asdict(saved), "settings": settings})
        say(f"resumed from {resume_from}: step {state.step}, epoch {state.epoch}, batch {state.batch_index}")
    if main_process:  # drop log lines written after the checkpoint by the run that stopped
        kept = [r for r in read_jsonl(log_path) if r["step"] <= state.step and not r.get("final")]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        remove_leftovers(checkpoint_root)
    if args.report_to != "none":
        accelerator.init_trackers(
            "logs", config={k: v for k, v in asdict(args).items() if isinstance(v, (int, float, str, bool))}
        )
    try:
        sampler.set_epoch(state.epoch, state.batch_index)
    except ValueError as error:  # the checkpoint was written with other batches (--batch_tokens, processes, data)
        raise UsageError(
            f"cannot continue {resume_from} at batch {state.batch_index} of epoch {state.epoch}: {error}."
        ) from error

    def checkpoint(interim):
        """A failed write (a full disk) ends the run, naming the checkpoint to resume from."""
        try:
            return save_checkpoint(accelerator, model, config, checkpoint_root, state, keep, interim)
        except Exception as error:  # whatever the writer raised: the previous checkpoint is intact
            complete = list_checkpoints(checkpoint_root)
            raise UsageError(
                f"could not write the checkpoint of step {state.step} in {checkpoint_root} ({error}). "
                f"The steps since {complete[-1] if complete else 'the start'} are lost, nothing else. "
                f"Free some space, then continue with:\n  {resume_command(argv)}"
            ) from error

    validation = partial(
        validate,
        accelerator,
        valid_loader=valid_loader,
        tokenizer=tokenizer,
        bleu_pairs=bleu_pairs,
        batch_size=args.eval_batch_size,
        num_beams=args.eval_num_beams,
        length_penalty=args.eval_length_penalty,
        max_source_length=args.max_source_length,
    )

    # --- Training (sections 5.2-5.4): one optimizer step per pass; `stop` ends the loop early with a message. ---
    batch_stream = iter(train_loader)
    unwrapped = accelerator.unwrap_model(model)
    run_tokens, run_seconds, last_eval, stop = 0, 0.0, {}, None
    progress = tqdm(
        total=args.max_steps, initial=state.step, disable=not main_process, desc="training", dynamic_ncols=True
    )
    model.train()
    with StopSignal() as signals:  # SIGTERM and SIGINT end the run after the step under way, checkpointed
        while state.step < args.max_steps and stop is None:
            step_start = time.perf_counter()
            batches = [next(batch_stream) for _ in range(args.grad_accum)]
            counts = torch.tensor(
                [
                    sum(int(b["labels"].ne(-100).sum()) for b in batches),
                    sum(int(b["attention_mask"].sum()) for b in batches),
                ],
                device=accelerator.device,
            )
            target_tokens, source_tokens = accelerator.reduce(counts, reduction="sum").tolist()
            # The step's smoothed loss and plain cross-entropy, summed over its tokens, and this process's stop vote.
            sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
            for index, batch in enumerate(batches):
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                labels = batch.pop("labels")  # the loss is ours: summed over the step's tokens, not averaged
                with accelerator.accumulate(model):
                    logits = model(**batch).logits
                    smoothed, plain = label_smoothed_cross_entropy(logits, labels, args.label_smoothing)
                    # The step's loss is the sum over all its target tokens divided by their number: DDP's average
                    # over processes and Accelerate's division by the accumulation steps are undone here.
                    scale = accelerator.num_processes * accelerator.gradient_accumulation_steps / target_tokens
                    loss = smoothed.sum() * scale
                    sums[0] += smoothed.sum().detach().double()
                    sums[1] += plain.sum().double()
                    if index == len(batches) - 1:
                        sums[2] = signals.received is not None
                        # One all-reduce gives every process the same losses and votes: all skip and stop after the
                        # same steps. Before the last backward pass, since DeepSpeed's engine updates inside it: a
                        # non-finite loss anywhere makes every process's gradients NaN, which the engine skips.
                        sums = accelerator.reduce(sums, reduction="sum")
                        finite = bool(sums[:2].isfinite().all())
                        if not finite and accelerator.distributed_type == DistributedType.DEEPSPEED:
                            loss = loss * float("nan")
                    accelerator.backward(loss)
            if not accelerator.sync_gradients:
                raise RuntimeError("gradient accumulation is out of step with --grad_accum")
            learning_rate = scheduler.get_last_lr()[0]
            if finite:  # else the weights and Adam's moments stay as they were
                if args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            skipped = not finite or accelerator.optimizer_step_was_skipped  # the latter: fp16 overflow
            seconds = time.perf_counter() - step_start
            tokens = int(source_tokens + target_tokens)

            state.add_step(tokens, int(target_tokens), seconds, finite, skipped, sums[0].item(), sums[1].item())
            state.batch_index += args.grad_accum
            if state.batch_index + args.grad_accum > len(sampler):  # epoch done: a new order of new batches
                state.epoch, state.batch_index = state.epoch + 1, 0
                sampler.set_epoch(state.epoch)
                batch_stream = iter(train_loader)
            run_tokens, run_seconds = run_tokens + tokens, run_seconds + seconds
            if not finite and main_process:
                progress.write(
                    f"step {state.step}: the loss is {sums[0].item()}; step skipped, weights unchanged "
                    f"({state.bad_streak} in a row, the run stops at --max_bad_steps {args.max_bad_steps})"
                )
            progress.update(1)

            if state.step % args.log_every == 0 or state.step == args.max_steps:
                record = state.take_log_record(learning_rate)
                progress.set_postfix(
                    loss=f"{record['loss']:.3f}", lr=f"{learning_rate:.2e}", tok_s=f"{record['tokens_per_sec']:.0f}"
                )
                accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
                if main_process:
                    append_jsonl(log_path, record)

            if args.eval_every and state.step % args.eval_every == 0:
                last_eval = validation(unwrapped)
                accelerator.log(
                    {f"valid/{k}": v for k, v in last_eval.items() if isinstance(v, float)}, step=state.step
                )
                if main_process:
                    append_jsonl(log_path, {"step": state.step, **last_eval})
                    progress.write(
                        f"step {state.step}: validation loss {last_eval['val_loss']:.3f}"
                        + (f", BLEU {last_eval['bleu']:.2f}" if "bleu" in last_eval else "")
                        + (f"; e.g. {last_eval['example'][:100]!r}" if "example" in last_eval else "")
                    )

            on_grid = state.step % args.save_every == 0 or state.step == args.max_steps
            signalled = sums[2].item() > 0
            if on_grid or signalled or state.step == args.stop_after:
                saved = checkpoint(interim=not on_grid)
            if state.bad_streak >= args.max_bad_steps:
                stop = (
                    f"{Path(sys.argv[0]).name}: error: "
                    + non_finite_loss_message(state, args.max_bad_steps, checkpoint_root),
                    1,
                )
            elif signalled:
                received = signals.received or signal.SIGTERM  # a process the signal missed stops with the others
                stop = (
                    f"{Path(sys.argv[0]).name}: {signal.Signals(received).name} received: stopped after step "
                    f"{state.step} of {args.max_steps}, checkpoint in {saved}. Continue with:\n  "
                    f"{resume_command(argv)}",
                    128 + received,
                )
            elif state.step == args.stop_after:
                stop = (f"stopped after step {state.step} (--stop_after); continue with --resume", 0)
    progress.close()
    # The DDP wrapper is done with. Freed now, while every process is still connected: its reducer holds the gloo
    # process group, and tearing that down after a peer has exited can wait for the peer forever (seen with two CPU
    # ranks, after the run's work was all done).
    model = optimizer = scheduler = None
    accelerator.free_memory()
    if stop is not None:
        message, exit_code = stop
        if main_process:
            print(message, file=sys.stderr if exit_code else sys.stdout, flush=True)
        accelerator.end_training()
        if exit_code:
            raise SystemExit(exit_code)
        return None

    # --- Section 6.1: the final model averages the last checkpoints. Every process computes the same average. ---
    trained_checksum = (
        weights_checksum(unwrapped)
        if accelerator.distributed_type not in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        else None
    )
    averaged_paths = [path for path in list_checkpoints(checkpoint_root) if not is_interim(path)][-args.average_last :]
    say(f"averaging {len(averaged_paths)} checkpoints: {', '.join(p.name for p in averaged_paths)}")
    final_model = VaswaniForConditionalGeneration(config)
    load_weights_into(final_model, average_checkpoints(averaged_paths))
    final_model.to(accelerator.device).eval()
    processes = gather_object(
        [
            {
                "rank": accelerator.process_index,
                "trained": trained_checksum,
                "averaged": weights_checksum(final_model),
                "tokenized": not train.from_cache,
            }
        ]
    )
    final_eval = validation(final_model)
    accelerator.log({f"final/{k}": v for k, v in final_eval.items() if isinstance(v, float)}, step=state.step)

    if main_process:
        final_model.save_pretrained(output_dir)  # config, weights, generation config (beam 4, alpha 0.6), code
        tokenizer.save_pretrained(output_dir)
        append_jsonl(
            log_path, {"step": state.step, "final": True, "averaged_checkpoints": len(averaged_paths), **final_eval}
        )
        write_plots(output_dir, args.lr_schedule, args.max_steps, args.warmup_steps, peak_lr, args.eval_bleu_samples)
        summary = {
            "preset": args.preset,
            "steps": state.step,
            "epochs": round(state.epoch + state.batch_index / max(len(sampler), 1), 3),
            "tokens_seen": state.tokens_seen,
            "target_tokens_seen": state.target_tokens_seen,
            "tokens_per_step": state.tokens_seen / max(state.step, 1),
            "tokens_per_sec": run_tokens / run_seconds if run_seconds else None,
            "train_seconds": state.train_seconds,
            "wall_seconds": time.time() - wall_start,
            "final_val_loss": final_eval["val_loss"],
            "final_val_ppl": final_eval["val_ppl"],
            "final_val_bleu": final_eval.get("bleu"),
            "bleu_signature": final_eval.get("bleu_signature"),
            "bleu_samples": len(bleu_pairs[0]),
            "last_periodic_eval": {k: v for k, v in last_eval.items() if k != "example"},
            "averaged_checkpoints": [p.name for p in averaged_paths],
            "num_parameters": final_model.num_parameters(),
            "train_pairs": len(train),
            "train_pairs_dropped": train.too_long,
            "train_pairs_truncated": train.truncated,
            "train_pairs_without_text": train.without_text,
            "skipped_steps": state.skipped_steps,
            "strategy": describe(accelerator),
            "hardware": hardware_description(accelerator),
            "world_size": accelerator.num_processes,
            "processes": processes,  # per process: checksums of its weights, and whether it tokenized the corpus
            "resumed_from": str(resume_from) if resume_from else None,
            "command": shlex.join([sys.executable, *sys.argv]),
            "launched_by_accelerate": "ACCELERATE_MIXED_PRECISION" in os.environ,
            "args": asdict(args),
        }
        (output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
        say(
            f"final model (average of {len(averaged_paths)} checkpoints) in {output_dir}: validation loss "
            f"{final_eval['val_loss']:.3f}"
            + (f", BLEU {final_eval['bleu']:.2f}" if "bleu" in final_eval else "")
            + f"; {summary['tokens_per_sec'] or 0:.0f} tokens/s"
        )
        if args.push_to_hub:
            try:
                say(f"pushed to the Hub: {push_to_hub(output_dir, args.hub_model_id, private=args.hub_private_repo)}")
            except PushError as error:  # the trained model is safe on disk: say how to push it again
                raise UsageError(
                    f"{error}\nThe model is saved in {output_dir}; push it later with: "
                    f"vaswani-push-to-hub --model_dir {output_dir} --repo_id {args.hub_model_id}"
                ) from error
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return final_model


if __name__ == "__main__":
    main()
