"""A training run's life in its output folder (sections 5 and 6.1), for any loop: the model it trains, where it
starts (afresh, or exactly where a checkpoint left off, with the settings that checkpoint was written with), when it
checkpoints, why it stops early, and its final model, the average of its last checkpoints.

    run = TrainingRun(output_dir, max_steps=1000, save_steps=100, argv=sys.argv[1:])
    config, checkpoint = run.config_and_checkpoint(config, tokenizer, resume_from_checkpoint)
    state = run.start(accelerator, settings, seed, checkpoint)      # after accelerator.prepare
    batches = run.step_batches(train_loader, state, gradient_accumulation_steps)
    ... each step: state.add_step(...); checkpoint = run.save_if_due(...); stop = run.stop_reason(...)
    final_model, averaged = run.average(accelerator, config)

`vaswani-train` (scripts/train.py) is such a loop; docs/architecture.md walks through it.
"""

import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from accelerate.utils import set_seed

from ..checks import UsageError, check_tokenizer_matches_config, tokenizer_ids
from ..configuration import VaswaniConfig
from ..modeling import VaswaniForConditionalGeneration
from ..modeling.generation_vaswani import EXTRA_OUTPUT_TOKENS
from .batching import StepBatches
from .checkpoints import (
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
)
from .data import split_fingerprint, tokenizer_fingerprint
from .faults import check_free_space, non_finite_loss_message, resume_command


# The arguments that decide the sequence of steps: which model, which batches in which order, with which random
# streams, learning rates and updates. A resumed run continues exactly only with the values its checkpoint was
# written with.
STEP_SETTINGS = (
    "batch_tokens",
    "gradient_accumulation_steps",
    "seed",
    "preset",
    "config_name",
    "config_overrides",
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
# The config fields a checkpoint's weights and steps depend on: a resumed run must build the same model. The
# vocabulary and special ids are the tokenizer's, checked with it; the position limit may grow (section 3.5's
# encodings have no weights).
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
    "activation_dropout",
    "activation_function",
    "sinusoid_layout",
    "position_offset",
    "attention_bias",
    "share_encoder_decoder_embeddings",
)
# Set by the tokenizer, whatever the preset, --config_name or --config_overrides say.
TOKENIZER_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def model_config(args, tokenizer):
    """The config of the model to train: a preset of Table 3 or --config_name, then --config_overrides and the
    --dropout / --attention_dropout / --init_scheme flags, with the tokenizer's vocabulary size and special ids; checked
    by `VaswaniConfig`'s own validation."""
    if args.config_name is not None:
        try:
            saved, _ = VaswaniConfig.get_config_dict(args.config_name)
        except (OSError, ValueError) as error:
            raise UsageError(f"--config_name {args.config_name}: {error}") from error
        if saved.get("model_type", VaswaniConfig.model_type) != VaswaniConfig.model_type:
            raise UsageError(
                f"--config_name {args.config_name} is a {saved['model_type']} config, not a {VaswaniConfig.model_type} one."
            )
        values = VaswaniConfig.from_dict(saved).to_dict()
    else:
        values = VaswaniConfig.from_preset(args.preset).to_dict()
    if args.config_overrides:
        values.update(parse_config_overrides(args.config_overrides, VaswaniConfig(**values)))
    values.update(
        {
            name: getattr(args, name)
            for name in ("dropout", "attention_dropout", "init_scheme")
            if getattr(args, name) is not None
        }
    )
    values.update(tokenizer_ids(tokenizer))
    if values["positional_encoding"] == "sinusoidal":  # section 3.5: no weight depends on the limit
        # Decoding runs to the source length + 50 (section 6.1), after the start token.
        longest = max(args.max_source_length, args.max_target_length) + EXTRA_OUTPUT_TOKENS + 1
        values["max_position_embeddings"] = max(values["max_position_embeddings"], longest)
    elif values["max_position_embeddings"] < max(args.max_source_length, args.max_target_length):
        raise UsageError(
            f"Learned positional embeddings (positional_encoding=learned) cover max_position_embeddings="
            f"{values['max_position_embeddings']} positions, fewer than --max_source_length {args.max_source_length} "
            f"and --max_target_length {args.max_target_length} allow: lower those or raise the table."
        )
    try:
        return VaswaniConfig(**values)
    except (TypeError, ValueError) as error:  # the config's own checks: heads dividing d_model, sizes, rates
        raise UsageError(f"the model config is not valid ({error}).") from error


def parse_config_overrides(overrides, config):
    """`--config_overrides "d_model=128,encoder_ffn_dim=256"` as {field: value}, each value of its field's type, read
    by transformers' `PretrainedConfig.update_from_string`."""
    names = [item.split("=", 1)[0].strip() for item in overrides.split(",")]
    if any("=" not in item for item in overrides.split(",")):
        raise UsageError(f'--config_overrides takes "field=value,field=value", not {overrides!r}.')
    fixed = [name for name in names if name in TOKENIZER_FIELDS]
    if fixed:
        raise UsageError(f"--config_overrides cannot set {', '.join(fixed)}: the tokenizer decides them.")
    try:
        for name, value in (item.replace(" ", "").split("=", 1) for item in overrides.split(",")):
            # update_from_string reads a value as the type of the field's current one, and refuses a field that is
            # None: the integers that default to None (d_k and d_v: d_model / heads) are read here.
            if getattr(config, name, 0) is None:
                setattr(config, name, int(value))
        config.update_from_string(overrides.replace(" ", ""))
    except (TypeError, ValueError) as error:  # an unknown field, or a value of the wrong type
        raise UsageError(f"--config_overrides {overrides!r}: {error}") from error
    return {name: getattr(config, name) for name in names}


def step_settings(args, accelerator, train_split, tokenizer):
    """The values that decide the sequence of steps, recorded in each checkpoint: STEP_SETTINGS, the launch, and
    fingerprints of the training split and the tokenizer."""
    return {
        **{name: getattr(args, name) for name in STEP_SETTINGS},
        "num_processes": accelerator.num_processes,
        "mixed_precision": accelerator.mixed_precision,
        # Under a name of its own: checkpoints of earlier versions recorded another fingerprint under "dataset".
        "train_split": split_fingerprint(train_split),
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }


@dataclass
class Stop:
    """Why a run ends before its last step: the message for the user and the exit status."""

    message: str
    exit_code: int = 0


class TrainingRun:
    """The checkpoints of a run in `output_dir`/checkpoints: every `save_steps` steps and at `max_steps`, the last
    max(`save_total_limit`, `average_last`) kept, the last `average_last` averaged into the final model (section 6.1).
    `argv` is the command's arguments, for the command that resumes the run."""

    def __init__(self, output_dir, *, max_steps, save_steps, save_total_limit=5, average_last=5, argv=()):
        self.checkpoint_root = Path(output_dir) / "checkpoints"
        self.max_steps, self.save_steps, self.average_last = max_steps, save_steps, average_last
        self.keep = max(save_total_limit, average_last)
        self.argv = list(argv)
        self.resumed_from = None

    def config_and_checkpoint(self, config, tokenizer, resume_from_checkpoint=None):
        """The config to train and the checkpoint to resume (None: start afresh), checked before anything starts:
        `resume_from_checkpoint` is None (the folder must hold no checkpoint yet), "latest" or a checkpoint folder,
        whose model must be `config`'s and whose vocabulary must be the tokenizer's. Creates the output folder, and
        fails now, too, if its disk cannot hold the run's checkpoints."""
        checkpoint = None
        if resume_from_checkpoint is None and list_checkpoints(self.checkpoint_root):
            raise UsageError(
                f"{self.checkpoint_root} already holds checkpoints of an earlier run; pass --resume_from_checkpoint "
                "to continue it, or choose another --output_dir."
            )
        if resume_from_checkpoint is not None:
            checkpoint, config = self.checkpoint_to_resume(resume_from_checkpoint, config, tokenizer)
            if checkpoint is None and int(os.environ.get("RANK", "0")) == 0:
                print(f"no checkpoint in {self.checkpoint_root} yet: starting from scratch.")
        existing = len(list_checkpoints(self.checkpoint_root))
        self.checkpoint_root.parent.mkdir(parents=True, exist_ok=True)
        check_free_space(self.checkpoint_root.parent, VaswaniForConditionalGeneration, config, self.keep, existing)
        return config, checkpoint

    def checkpoint_to_resume(self, resume_from_checkpoint, config, tokenizer):
        """The checkpoint named (or None: there is none yet) and its config, checked against `config`."""
        latest = resume_from_checkpoint == "latest"
        candidates = list_checkpoints(self.checkpoint_root) if latest else [Path(resume_from_checkpoint)]
        if not latest and not (candidates[0] / TRAIN_STATE_FILE).is_file():
            raise UsageError(
                f"--resume_from_checkpoint {resume_from_checkpoint} is not a complete checkpoint (no {TRAIN_STATE_FILE})."
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
                    f"checkpoint {checkpoint} was trained with {name}={getattr(saved, name)}, but this command asks "
                    f"for {getattr(config, name)}; resume with the original --preset / --config_name / "
                    "--config_overrides / --dropout."
                )
        check_checkpoint_fits(checkpoint, VaswaniForConditionalGeneration, saved)
        return checkpoint, saved

    def start(self, accelerator, settings, seed, checkpoint=None, resume_with_changes=False):
        """Step 0, or exactly where `checkpoint` left off (weights, Adam's moments, schedule, every process's random
        streams, the position in the batches), once the model, optimizer and schedule are prepared. A checkpoint
        written with other `settings` is refused unless `resume_with_changes`."""
        set_seed(seed, device_specific=True)  # a different dropout stream on each process
        state = TrainState(settings=settings)
        if checkpoint is not None:
            saved = TrainState.read(checkpoint)
            changes = settings_changes(saved.settings, settings)
            if changes and not resume_with_changes:
                raise UsageError(
                    f"checkpoint {checkpoint} was written with other settings that decide the steps: "
                    + "; ".join(changes)
                    + ". Resume with those, or pass --resume_with_changes to continue "
                    "anyway (the run is then no longer the one an uninterrupted run would have been)."
                )
            if changes:
                accelerator.print(
                    "warning: resuming with changed settings (--resume_with_changes): " + "; ".join(changes)
                )
            try:
                accelerator.load_state(str(checkpoint))
            except (
                Exception
            ) as error:  # a damaged file, or a pickle holding more than tensors (read with weights_only)
                raise UsageError(f"cannot load checkpoint {checkpoint} ({type(error).__name__}: {error}).") from error
            state, self.resumed_from = TrainState(**{**asdict(saved), "settings": settings}), checkpoint
            accelerator.print(
                f"resumed from {checkpoint}: step {state.step}, epoch {state.epoch}, batch {state.batch_index}"
            )
        if accelerator.is_main_process:
            remove_leftovers(self.checkpoint_root)
        return state

    def step_batches(self, train_loader, state, gradient_accumulation_steps):
        """Each step's batches from where `state` stands (`StepBatches`)."""
        try:
            return StepBatches(train_loader, state, gradient_accumulation_steps)
        except ValueError as error:  # the checkpoint was written with other batches (--batch_tokens, processes, data)
            raise UsageError(
                f"cannot continue {self.resumed_from} at batch {state.batch_index} of epoch {state.epoch}: {error}."
            ) from error

    def save_if_due(self, accelerator, model, config, state, result, stop_after=None):
        """The checkpoint of the step just taken if one is due (None if not): on the grid of `save_steps` and at
        `max_steps`, and off it (an interim checkpoint, replaced by the next) when a process was asked to stop or at
        `stop_after`. A failed write (a full disk) ends the run, naming the checkpoint to resume."""
        on_grid = state.step % self.save_steps == 0 or state.step == self.max_steps
        if not (on_grid or result.stop_votes or state.step == stop_after):
            return None
        try:
            return save_checkpoint(accelerator, model, config, self.checkpoint_root, state, self.keep, not on_grid)
        except Exception as error:  # whatever the writer raised: the previous checkpoint is intact
            complete = list_checkpoints(self.checkpoint_root)
            raise UsageError(
                f"could not write the checkpoint of step {state.step} in {self.checkpoint_root} ({error}). "
                f"The steps since {complete[-1] if complete else 'the start'} are lost, nothing else. "
                f"Free some space, then continue with:\n  {resume_command(self.argv)}"
            ) from error

    def stop_reason(self, state, result, signals, checkpoint, max_bad_steps, stop_after=None):
        """Why the run ends after this step, if it does: a non-finite loss `max_bad_steps` steps in a row, a signal to
        any process (`StopSignal`: all stop after the same step, its checkpoint written), or `stop_after`."""
        program = Path(sys.argv[0]).name
        if state.bad_streak >= max_bad_steps:
            message = non_finite_loss_message(state, max_bad_steps, self.checkpoint_root)
            return Stop(f"{program}: error: {message}", 1)
        if result.stop_votes:
            received = signals.received or signal.SIGTERM  # a process the signal missed stops with the others
            return Stop(
                f"{program}: {signal.Signals(received).name} received: stopped after step {state.step} of "
                f"{self.max_steps}, checkpoint in {checkpoint}. Continue with:\n  {resume_command(self.argv)}",
                128 + received,
            )
        if state.step == stop_after:
            return Stop(f"stopped after step {state.step} (--stop_after); continue with --resume_from_checkpoint")
        return None

    def average(self, accelerator, config):
        """Section 6.1: the final model, the average of the last `average_last` regular checkpoints, on every process;
        and the checkpoints averaged."""
        paths = [path for path in list_checkpoints(self.checkpoint_root) if not is_interim(path)][-self.average_last :]
        accelerator.print(f"averaging {len(paths)} checkpoints: {', '.join(path.name for path in paths)}")
        final_model = VaswaniForConditionalGeneration(config)
        load_weights_into(final_model, average_checkpoints(paths))
        return final_model.to(accelerator.device).eval(), paths


class TrainingCallback:
    """Hooks into a training loop (vaswani-train's: `main(argv, callbacks=[...])`), as transformers' `TrainerCallback`
    into `Trainer`: to watch a run, or to inject a fault into it. Each event does nothing unless overridden."""

    def on_train_begin(self, accelerator, model, optimizer):
        """The model and optimizer are built, not yet prepared: torch's module and optimizer hooks, and accelerate's
        save-state hooks (`accelerator.register_save_state_pre_hook`), can be registered now."""

    def on_step_end(self, state, result):
        """An optimizer step was taken and counted (`state.add_step`), before it is logged or checkpointed."""
