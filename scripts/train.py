"""Train the Transformer with the recipe of "Attention Is All You Need", section 5, through Hugging Face Accelerate.

`main` follows the paper: 5.1 batches of about --batch_tokens tokens (vaswani.training.data, .batching), 5.2 one
optimizer step per batch (vaswani.training.step), 5.3 Adam with the warmup-then-inverse-square-root learning rate
(vaswani.training.schedule), 5.4 dropout and label smoothing, 6.1 the last checkpoints averaged into the final model
(vaswani.training.checkpoints). The flags take transformers' `TrainingArguments` names where the meaning is the same.

  python scripts/train.py --dataset_dir DIR --tokenizer TOK --preset small --output_dir OUT --max_steps 1000
  accelerate launch [--config_file configs/multi_gpu.yaml] scripts/train.py ...      (configs/README.md)
  vaswani-train ... --output_dir OUT --resume_from_checkpoint    continue a stopped run exactly where it stopped

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
from typing import TYPE_CHECKING, Literal

# Only what the arguments need is imported here (light modules: no torch, accelerate, datasets or transformers' model
# code), so that --help and a mistake in the arguments answer at once; each function imports the rest it uses.
from vaswani.configuration.choices import INIT_SCHEME_NAMES, PRESET_NAMES
from vaswani.training.checks import UsageError, check_tokenizer_matches_config, check_writable_dir, tokenizer_ids
from vaswani.training.cli import command, parse_arguments
from vaswani.training.records import append_jsonl, hardware_description, read_jsonl, write_plots
from vaswani.training.schedule import SCHEDULES, inverse_sqrt_schedule, peak_lr_of


if TYPE_CHECKING:
    import torch

    from vaswani.training.data import TokenizedSplit


# accelerate warns at every save that it leaves out the tied copies of the shared embedding (section 3.4); that is
# intended, and load_weights_into() checks that nothing else is missing.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)

# The arguments that decide the sequence of steps: which batches, in which order, with which random streams, learning
# rates and updates. A resumed run continues exactly only with the values its checkpoint was written with.
STEP_SETTINGS = (
    "batch_tokens",
    "gradient_accumulation_steps",
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
    "adam_epsilon",
    "label_smoothing_factor",
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
    gradient_accumulation_steps: int = field(
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
    preset: Literal[tuple(sorted(PRESET_NAMES))] = "base"
    dropout: float | None = field(default=None, metadata={"help": "P_drop (section 5.4); default: the preset's"})
    attention_dropout: float | None = field(default=None, metadata={"help": "default: the config's (0)"})
    init_scheme: Literal[INIT_SCHEME_NAMES] | None = field(
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
    adam_epsilon: float = 1e-9
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "epsilon_ls (section 5.4)"})
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
    use_cpu: bool = field(default=False, metadata={"help": "train on the CPU even if a GPU is present"})
    ddp_timeout: int = field(
        default=1800,
        metadata={
            "help": "seconds a process waits for the others, e.g. while the main process tokenizes the corpus the first "
            "time (as transformers' TrainingArguments.ddp_timeout)"
        },
    )
    # Checkpoints and output (section 6.1).
    save_steps: int = field(default=1000, metadata={"help": "steps between checkpoints"})
    save_total_limit: int = field(default=5, metadata={"help": "how many recent checkpoints to keep"})
    average_last: int = field(
        default=5,
        metadata={"help": "average the last K checkpoints into the final model (paper: 5 base, 20 big); 1: none"},
    )
    resume_from_checkpoint: str | None = field(
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
    eval_steps: int = field(default=1000, metadata={"help": "steps between validations; 0: only at the end"})
    eval_bleu_samples: int = field(default=500, metadata={"help": "BLEU on the first N validation pairs; 0: none"})
    generation_num_beams: int = field(default=1, metadata={"help": "1: greedy decoding; 4: the paper's beam"})
    eval_length_penalty: float = 0.6
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "sentences per generate() call"})
    logging_steps: int = field(default=50, metadata={"help": "steps between training-loss log lines"})
    report_to: Literal["tensorboard", "none"] = "tensorboard"
    # For the tests of --resume_from_checkpoint: checkpoint and stop after this step, as if killed there.
    stop_after: int | None = field(default=None, metadata={"help": argparse.SUPPRESS})

    def __post_init__(self):
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id NAMESPACE/NAME")
        for name in (
            "batch_tokens",
            "gradient_accumulation_steps",
            "max_steps",
            "warmup_steps",
            "save_steps",
            "save_total_limit",
            "average_last",
            "logging_steps",
            "generation_num_beams",
            "per_device_eval_batch_size",
            "max_source_length",
            "max_target_length",
            "max_bad_steps",
            "num_proc",
            "ddp_timeout",
        ):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1")
        if not 0.0 <= self.label_smoothing_factor < 1.0:
            raise UsageError("--label_smoothing_factor must be in [0, 1)")
        if self.dataloader_num_workers < 0:
            raise UsageError("--dataloader_num_workers must be at least 0")


def model_config(args, tokenizer):
    """A preset of Table 3 with the tokenizer's vocabulary size and special ids."""
    from vaswani import VaswaniConfig

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


def config_and_checkpoint(args, checkpoint_root, tokenizer):
    """The model's config and the checkpoint to resume (None: start afresh), checked before anything starts."""
    from vaswani.training.checkpoints import list_checkpoints

    config = model_config(args, tokenizer)
    if args.resume_from_checkpoint is None:
        if list_checkpoints(checkpoint_root):
            raise UsageError(
                f"{checkpoint_root} already holds checkpoints of an earlier run; pass --resume_from_checkpoint to "
                "continue it, or choose another --output_dir."
            )
        return config, None
    checkpoint, config = checkpoint_to_resume(args, checkpoint_root, config, tokenizer)
    if checkpoint is None and int(os.environ.get("RANK", "0")) == 0:
        print(f"--resume_from_checkpoint: no checkpoint in {checkpoint_root} yet, starting from scratch.")
    return config, checkpoint


def checkpoint_to_resume(args, checkpoint_root, config, tokenizer):
    """The checkpoint --resume_from_checkpoint names (or None to start afresh) and its config, checked against this
    command's."""
    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani.training.checkpoints import TRAIN_STATE_FILE, check_checkpoint_fits, list_checkpoints

    candidates = (
        list_checkpoints(checkpoint_root)
        if args.resume_from_checkpoint == "latest"
        else [Path(args.resume_from_checkpoint)]
    )
    if args.resume_from_checkpoint != "latest" and not (candidates[0] / TRAIN_STATE_FILE).is_file():
        raise UsageError(
            f"--resume_from_checkpoint {args.resume_from_checkpoint} is not a complete checkpoint (no {TRAIN_STATE_FILE})."
        )
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
    from vaswani.training.batching import TokenBucketSampler

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


@dataclass
class Stop:
    """Why a run ends before --max_steps: the message for the user and the exit status."""

    message: str
    exit_code: int = 0


@dataclass
class ThisRun:
    """What this command did, as against the whole run, which may have been resumed from a checkpoint."""

    resumed_from: Path | None
    wall_start: float = field(default_factory=time.time)
    tokens: int = 0
    seconds: float = 0.0
    last_eval: dict = field(default_factory=dict)


@dataclass
class RunData:
    """The tokenized splits as batches (section 5.1), and the validation pairs that BLEU is measured on."""

    train: "TokenizedSplit"
    train_loader: "torch.utils.data.DataLoader"
    valid_loader: "torch.utils.data.DataLoader"
    bleu_pairs: tuple


def launch(args, output_dir):
    """The accelerator of what `accelerate launch` set (processes, DDP / FSDP / DeepSpeed, precision), or a stop here
    saying why that strategy cannot run (vaswani.training.distributed)."""
    from vaswani.training.distributed import LaunchedStrategy, describe

    strategy = LaunchedStrategy.from_environment(cpu=args.use_cpu)
    accelerator = strategy.accelerator(
        output_dir,
        args.ddp_timeout,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        step_scheduler_with_optimizer=False,  # our schedule steps once per optimizer step, whatever the process count
        log_with=None if args.report_to == "none" else args.report_to,
    )
    strategy.check(accelerator)
    accelerator.print(f"strategy: {describe(accelerator)}")
    return accelerator


def load_data(accelerator, dataset, tokenizer, config, args):
    """The training and validation pairs tokenized once into Arrow next to the dataset, and their batches.

    The main process tokenizes first; then the first process of every other machine, which finds the files on a
    shared file system or else builds its machine's own copy; then all the others, which map the files."""
    from vaswani.training.data import PairCollator, pair_loader, tokenize_split

    with accelerator.main_process_first(), accelerator.local_main_process_first():
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
    if not len(train):
        raise UsageError(
            f"no training pair fits --max_source_length {args.max_source_length} / --max_target_length "
            f"{args.max_target_length} ({train.without_text} of them are not text)."
        )
    if not len(valid):
        raise UsageError("the validation split has no pair with text on both sides.")
    per_step = args.gradient_accumulation_steps
    sampler = bucket_sampler(train, "training", args, accelerator, seed=args.seed, batches_per_step=per_step)
    valid_sampler = bucket_sampler(valid, "validation", args, accelerator, shuffle=False, drop_remainder=False)
    steps_per_epoch = sampler.batches_in_epoch(0) // per_step
    if steps_per_epoch == 0:
        raise UsageError(
            f"the training split makes fewer batches of --batch_tokens {args.batch_tokens} than processes x "
            f"--gradient_accumulation_steps ({accelerator.num_processes} x {per_step}); lower either."
        )
    collator = PairCollator(config.pad_token_id, config.decoder_start_token_id)
    pin_memory = accelerator.device.type == "cuda"  # batches then copy to the GPU without blocking (train_step)
    bleu_rows = valid.rows[: args.eval_bleu_samples].tolist()
    bleu_texts = dataset["validation"].select(bleu_rows)["translation"] if bleu_rows else []
    accelerator.print(
        f"train: {len(train)} pairs ({train.too_long} longer than the maximum lengths dropped, {train.truncated} "
        f"truncated, {train.without_text} without text dropped); validation: {len(valid)} pairs "
        f"({valid.without_text} without text dropped); tokenized "
        + ("earlier, read from the cache" if train.from_cache else "now and cached")
        + " next to the dataset\n"
        f"batches of <= {args.batch_tokens} padded tokens x {per_step} accumulated x {accelerator.num_processes} "
        f"processes = <= {args.batch_tokens * per_step * accelerator.num_processes} tokens per optimizer step "
        f"(paper: ~25000 source + ~25000 target); {steps_per_epoch} steps per epoch"
    )
    return RunData(
        train=train,
        train_loader=pair_loader(
            train, sampler, collator, num_workers=args.dataloader_num_workers, pin_memory=pin_memory
        ),
        valid_loader=pair_loader(valid, valid_sampler, collator, pin_memory=pin_memory),
        bleu_pairs=([pair[args.source_lang] for pair in bleu_texts], [pair[args.target_lang] for pair in bleu_texts]),
    )


def build_training(accelerator, config, args):
    """The model (the same initial weights on every process), Adam and the learning-rate schedule (section 5.3),
    prepared for the launched strategy; and the schedule's peak."""
    from accelerate.utils import set_seed

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.training.distributed import configure_deepspeed, shard_shared_embedding
    from vaswani.training.step import recipe_adam

    set_seed(args.seed)
    model = VaswaniForConditionalGeneration(config)
    shard_shared_embedding(accelerator, model)
    accelerator.print(
        f"model: preset {args.preset}, {model.num_parameters() / 1e6:.1f}M parameters, d_model {config.d_model}, "
        f"dropout {config.dropout}, vocabulary {config.vocab_size}"
    )
    optimizer = recipe_adam(
        accelerator, model.parameters(), betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon
    )
    peak_lr = peak_lr_of(args.lr_schedule, config.d_model, args.warmup_steps, args.lr_scale, args.peak_lr)
    scheduler = inverse_sqrt_schedule(optimizer, args.warmup_steps, peak_lr)
    configure_deepspeed(accelerator, args.max_grad_norm)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.gradient_accumulation_steps != args.gradient_accumulation_steps:
        raise UsageError(
            f"the accelerate config accumulates {accelerator.gradient_accumulation_steps} batches but "
            f"--gradient_accumulation_steps is {args.gradient_accumulation_steps}; make them agree."
        )
    return model, optimizer, scheduler, peak_lr


def starting_state(accelerator, args, resume_from, settings, log_path, checkpoint_root):
    """Step 0, or exactly where the checkpoint `resume_from` left off: weights, Adam's moments, schedule, every
    process's random streams and the position in the batches. Log lines written after the checkpoint go."""
    from accelerate.utils import set_seed

    from vaswani.training.checkpoints import TrainState, remove_leftovers, settings_changes

    state = TrainState(settings=settings)
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
            accelerator.print("warning: resuming with changed settings (--resume_with_changes): " + "; ".join(changes))
        try:
            accelerator.load_state(str(resume_from))
        except Exception as error:  # a damaged file, or a pickle holding more than tensors (read with weights_only)
            raise UsageError(f"cannot load checkpoint {resume_from} ({type(error).__name__}: {error}).") from error
        state = TrainState(**{**asdict(saved), "settings": settings})
        accelerator.print(
            f"resumed from {resume_from}: step {state.step}, epoch {state.epoch}, batch {state.batch_index}"
        )
    if accelerator.is_main_process:
        kept = [record for record in read_jsonl(log_path) if record["step"] <= state.step and not record.get("final")]
        log_path.write_text("".join(json.dumps(record) + "\n" for record in kept))
        remove_leftovers(checkpoint_root)
    return state


def step_batches(data, state, args, resume_from):
    from vaswani.training.batching import StepBatches

    try:
        return StepBatches(data.train_loader, state, args.gradient_accumulation_steps)
    except ValueError as error:  # the checkpoint was written with other batches (--batch_tokens, processes, data)
        raise UsageError(
            f"cannot continue {resume_from} at batch {state.batch_index} of epoch {state.epoch}: {error}."
        ) from error


def save(accelerator, model, config, checkpoint_root, state, keep, interim, argv):
    """A checkpoint of the step just taken; a failed write (a full disk) ends the run, naming the one to resume."""
    from vaswani.training.checkpoints import list_checkpoints, save_checkpoint
    from vaswani.training.faults import resume_command

    try:
        return save_checkpoint(accelerator, model, config, checkpoint_root, state, keep, interim)
    except Exception as error:  # whatever the writer raised: the previous checkpoint is intact
        complete = list_checkpoints(checkpoint_root)
        raise UsageError(
            f"could not write the checkpoint of step {state.step} in {checkpoint_root} ({error}). "
            f"The steps since {complete[-1] if complete else 'the start'} are lost, nothing else. "
            f"Free some space, then continue with:\n  {resume_command(argv)}"
        ) from error


def report_step(accelerator, progress, state, step, args, log_path):
    """The progress bar, a word on a skipped step, and every --logging_steps the train_log.jsonl line of the steps
    since the last one, also to the tracker."""
    progress.update(1)
    if not step.finite and accelerator.is_main_process:
        progress.write(
            f"step {state.step}: the loss is {step.loss}; step skipped, weights unchanged "
            f"({state.bad_streak} in a row, the run stops at --max_bad_steps {args.max_bad_steps})"
        )
    if state.step % args.logging_steps and state.step != args.max_steps:
        return
    learning_rate = step.learning_rate
    record = state.take_log_record(learning_rate)
    progress.set_postfix(
        loss=f"{record['loss']:.3f}", lr=f"{learning_rate:.2e}", tok_s=f"{record['tokens_per_sec']:.0f}"
    )
    accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
    if accelerator.is_main_process:
        append_jsonl(log_path, record)


def log_validation(accelerator, progress, state, result, log_path):
    accelerator.log({f"valid/{k}": v for k, v in result.items() if isinstance(v, float)}, step=state.step)
    if accelerator.is_main_process:
        append_jsonl(log_path, {"step": state.step, **result})
        progress.write(
            f"step {state.step}: validation loss {result['val_loss']:.3f}"
            + (f", BLEU {result['bleu']:.2f}" if "bleu" in result else "")
            + (f"; e.g. {result['example'][:100]!r}" if "example" in result else "")
        )
    return result


def why_stop(state, result, args, signals, checkpoint, checkpoint_root, argv):
    """The reason to end the run after this step, if there is one: a non-finite loss for too long, a signal to any
    process (all stop after the same step), or --stop_after."""
    from vaswani.training.faults import non_finite_loss_message, resume_command

    program = Path(sys.argv[0]).name
    if state.bad_streak >= args.max_bad_steps:
        return Stop(f"{program}: error: " + non_finite_loss_message(state, args.max_bad_steps, checkpoint_root), 1)
    if result.stop_votes:
        received = signals.received or signal.SIGTERM  # a process the signal missed stops with the others
        return Stop(
            f"{program}: {signal.Signals(received).name} received: stopped after step {state.step} of "
            f"{args.max_steps}, checkpoint in {checkpoint}. Continue with:\n  {resume_command(argv)}",
            128 + received,
        )
    if state.step == args.stop_after:
        return Stop(f"stopped after step {state.step} (--stop_after); continue with --resume_from_checkpoint")
    return None


def step_settings(args, accelerator, dataset, tokenizer):
    """The values that decide the sequence of steps, recorded in each checkpoint (STEP_SETTINGS and the launch)."""
    from vaswani.training.data import split_fingerprint, tokenizer_fingerprint

    return {
        **{name: getattr(args, name) for name in STEP_SETTINGS},
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        # Under a name of its own: checkpoints of earlier versions recorded another fingerprint under "dataset".
        "train_split": split_fingerprint(dataset["train"]),
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }


def validation_options(data, tokenizer, args):
    """`validate`'s data and decoding: the validation loss over its batches, BLEU of the first --eval_bleu_samples."""
    return {
        "valid_loader": data.valid_loader,
        "tokenizer": tokenizer,
        "bleu_pairs": data.bleu_pairs,
        "batch_size": args.per_device_eval_batch_size,
        "num_beams": args.generation_num_beams,
        "length_penalty": args.eval_length_penalty,
        "max_source_length": args.max_source_length,
    }


def process_records(accelerator, trained_model, final_model, data):
    """Per process: checksums of its trained and averaged weights (the same on every process of a data-parallel run;
    sharded weights have no whole copy to sum), and whether it tokenized the corpus."""
    from accelerate.utils import DistributedType, gather_object

    from vaswani.training.checkpoints import weights_checksum

    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    return gather_object(
        [
            {
                "rank": accelerator.process_index,
                "trained": None if sharded else weights_checksum(trained_model),
                "averaged": weights_checksum(final_model),
                "tokenized": not data.train.from_cache,
            }
        ]
    )


def average_last_checkpoints(accelerator, config, checkpoint_root, average_last):
    """Section 6.1: the final model is the average of the last regular checkpoints; every process computes it."""
    from vaswani import VaswaniForConditionalGeneration
    from vaswani.training.checkpoints import average_checkpoints, is_interim, list_checkpoints, load_weights_into

    paths = [path for path in list_checkpoints(checkpoint_root) if not is_interim(path)][-average_last:]
    accelerator.print(f"averaging {len(paths)} checkpoints: {', '.join(path.name for path in paths)}")
    final_model = VaswaniForConditionalGeneration(config)
    load_weights_into(final_model, average_checkpoints(paths))
    return final_model.to(accelerator.device).eval(), paths


def write_summary(output_dir, args, state, run, data, final_model, final_eval, averaged, accelerator, processes):
    """training_summary.json: what the run did, measured, and how it was started; and its last words."""
    from vaswani.training.distributed import describe

    summary = {
        "preset": args.preset,
        "steps": state.step,
        "epochs": round(state.epoch + state.batch_index / max(len(data.train_loader.sampler), 1), 3),
        "tokens_seen": state.tokens_seen,
        "target_tokens_seen": state.target_tokens_seen,
        "tokens_per_step": state.tokens_seen / max(state.step, 1),
        "tokens_per_sec": run.tokens / run.seconds if run.seconds else None,
        "train_seconds": state.train_seconds,
        "wall_seconds": time.time() - run.wall_start,
        "final_val_loss": final_eval["val_loss"],
        "final_val_ppl": final_eval["val_ppl"],
        "final_val_bleu": final_eval.get("bleu"),
        "bleu_signature": final_eval.get("bleu_signature"),
        "bleu_samples": len(data.bleu_pairs[0]),
        "last_periodic_eval": {k: v for k, v in run.last_eval.items() if k != "example"},
        "averaged_checkpoints": [path.name for path in averaged],
        "num_parameters": final_model.num_parameters(),
        "train_pairs": len(data.train),
        "train_pairs_dropped": data.train.too_long,
        "train_pairs_truncated": data.train.truncated,
        "train_pairs_without_text": data.train.without_text,
        "skipped_steps": state.skipped_steps,
        "strategy": describe(accelerator),
        "hardware": hardware_description(accelerator),
        "world_size": accelerator.num_processes,
        "processes": processes,  # per process: checksums of its weights, and whether it tokenized the corpus
        "resumed_from": str(run.resumed_from) if run.resumed_from else None,
        "command": shlex.join([sys.executable, *sys.argv]),
        "launched_by_accelerate": "ACCELERATE_MIXED_PRECISION" in os.environ,
        "args": asdict(args),
    }
    (output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"final model (average of {len(averaged)} checkpoints) in {output_dir}: validation loss "
        f"{final_eval['val_loss']:.3f}"
        + (f", BLEU {final_eval['bleu']:.2f}" if "bleu" in final_eval else "")
        + f"; {summary['tokens_per_sec'] or 0:.0f} tokens/s"
    )


def push(output_dir, args):
    """Upload the final model (one commit); a failure leaves it safe on disk and says how to push it again."""
    from vaswani.training.hub import PushError, push_to_hub

    try:
        print(f"pushed to the Hub: {push_to_hub(output_dir, args.hub_model_id, private=args.hub_private_repo)}")
    except PushError as error:
        raise UsageError(
            f"{error}\nThe model is saved in {output_dir}; push it later with: "
            f"vaswani-push-to-hub --model_dir {output_dir} --repo_id {args.hub_model_id}"
        ) from error


@command(extra="train", needs=("accelerate", "datasets", "sacrebleu", "sacremoses", "tqdm"))
def main(argv):
    (args,) = parse_arguments([TrainArguments], argv, description=__doc__.split("\n\n")[0])
    from tqdm.auto import tqdm

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.training.checkpoints import list_checkpoints
    from vaswani.training.data import load_translation_dataset
    from vaswani.training.evaluation import validate
    from vaswani.training.faults import StopSignal, check_free_space
    from vaswani.training.step import train_step
    from vaswani.training.tokenizer import load_tokenizer

    # --- Checks that would otherwise fail hours later, before any process group starts. ---
    output_dir = check_writable_dir(args.output_dir)
    checkpoint_root, log_path = output_dir / "checkpoints", output_dir / "train_log.jsonl"
    dataset = load_translation_dataset(args.dataset_dir, args.source_lang, args.target_lang)
    tokenizer = load_tokenizer(args.tokenizer)
    config, resume_from = config_and_checkpoint(args, checkpoint_root, tokenizer)
    run = ThisRun(resumed_from=resume_from)
    keep = max(args.save_total_limit, args.average_last)
    check_free_space(output_dir, VaswaniForConditionalGeneration, config, keep, len(list_checkpoints(checkpoint_root)))

    accelerator = launch(args, output_dir)
    data = load_data(accelerator, dataset, tokenizer, config, args)
    model, optimizer, scheduler, peak_lr = build_training(accelerator, config, args)
    settings = step_settings(args, accelerator, dataset, tokenizer)
    state = starting_state(accelerator, args, resume_from, settings, log_path, checkpoint_root)
    if args.report_to != "none":
        accelerator.init_trackers(
            "logs", config={k: v for k, v in asdict(args).items() if isinstance(v, (int, float, str, bool))}
        )
    batches = step_batches(data, state, args, resume_from)
    validation = partial(validate, accelerator, **validation_options(data, tokenizer, args))

    # --- Training (sections 5.2-5.4): one optimizer step per pass, until --max_steps or a reason to stop. ---
    unwrapped, stop, checkpoint = accelerator.unwrap_model(model), None, None
    progress = tqdm(total=args.max_steps, initial=state.step, disable=not accelerator.is_main_process, desc="training")
    model.train()
    with StopSignal() as signals:  # SIGTERM and SIGINT end the run after the step under way, checkpointed
        while state.step < args.max_steps and stop is None:
            started = time.perf_counter()
            step = train_step(
                accelerator,
                model,
                optimizer,
                scheduler,
                next(batches),
                args.label_smoothing_factor,
                args.max_grad_norm,
                stop_vote=signals.received is not None,
            )
            seconds = time.perf_counter() - started
            state.add_step(step, seconds)
            run.tokens, run.seconds = run.tokens + step.tokens, run.seconds + seconds
            report_step(accelerator, progress, state, step, args, log_path)
            if args.eval_steps and state.step % args.eval_steps == 0:
                run.last_eval = log_validation(accelerator, progress, state, validation(unwrapped), log_path)
            on_grid = state.step % args.save_steps == 0 or state.step == args.max_steps
            if on_grid or step.stop_votes or state.step == args.stop_after:
                checkpoint = save(accelerator, model, config, checkpoint_root, state, keep, not on_grid, argv)
            stop = why_stop(state, step, args, signals, checkpoint, checkpoint_root, argv)
    progress.close()
    # The DDP wrapper is done with. Freed now, while every process is still connected: its reducer holds the gloo
    # process group, and tearing that down after a peer has exited can wait for the peer forever (seen with two CPU
    # ranks, after the run's work was all done).
    model = optimizer = scheduler = None
    accelerator.free_memory()
    if stop is not None:
        accelerator.print(stop.message, file=sys.stderr if stop.exit_code else sys.stdout, flush=True)
        accelerator.end_training()
        if stop.exit_code:
            raise SystemExit(stop.exit_code)
        return None

    # --- Section 6.1: the final model averages the last checkpoints. ---
    final_model, averaged = average_last_checkpoints(accelerator, config, checkpoint_root, args.average_last)
    processes = process_records(accelerator, unwrapped, final_model, data)
    final_eval = validation(final_model)
    accelerator.log({f"final/{k}": v for k, v in final_eval.items() if isinstance(v, float)}, step=state.step)
    if accelerator.is_main_process:
        final_model.save_pretrained(output_dir)  # config, weights, generation config (beam 4, alpha 0.6), code
        tokenizer.save_pretrained(output_dir)
        append_jsonl(
            log_path, {"step": state.step, "final": True, "averaged_checkpoints": len(averaged), **final_eval}
        )
        write_plots(output_dir, args.lr_schedule, args.max_steps, args.warmup_steps, peak_lr, args.eval_bleu_samples)
        write_summary(output_dir, args, state, run, data, final_model, final_eval, averaged, accelerator, processes)
        if args.push_to_hub:
            push(output_dir, args)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return final_model


if __name__ == "__main__":
    main()
