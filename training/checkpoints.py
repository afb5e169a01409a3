"""Checkpoints: save a run's whole state so that it continues exactly, keep the last few, and average the last ones
into the final model (section 6.1: "a single model obtained by averaging the last 5 checkpoints").

A checkpoint is a folder `step_XXXXXXX` holding what `accelerate` saves (weights, optimizer and scheduler states,
every process's random states), the model's config.json, and train_state.json, written last: a folder without it is
not a checkpoint. Folders are written under a temporary name and renamed into place after an fsync, so a run killed
at any moment leaves no half-written folder that could be taken for a checkpoint.
"""

import hashlib
import json
import math
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..checks import UsageError


CHECKPOINT_NAME = re.compile(r"^step_(\d{7})$")
TRAIN_STATE_FILE = "train_state.json"
LOG_WINDOW_KEYS = ("loss", "nll", "target_tokens", "tokens", "seconds", "steps", "skipped")
# Settings recorded by checkpoints written before the training command took transformers' `TrainingArguments` names.
RENAMED_SETTINGS = {
    "grad_accum": "gradient_accumulation_steps",
    "adam_eps": "adam_epsilon",
    "label_smoothing": "label_smoothing_factor",
}


@dataclass
class TrainState:
    """Where a run stands after `step` optimizer steps: what a checkpoint adds to accelerate's own files.

    `batch_index` is the position in epoch `epoch`'s batches; `skipped_steps` counts steps without an update
    (non-finite loss, fp16 overflow), `bad_streak` the non-finite losses in a row, and `good_weights_step` the step
    whose weights last gave a finite loss. `settings` are the values that decide the steps (see `settings_changes`),
    and `log_window` the sums of the steps since the last log line.
    """

    step: int = 0
    epoch: int = 0
    batch_index: int = 0
    tokens_seen: int = 0
    target_tokens_seen: int = 0
    train_seconds: float = 0.0
    skipped_steps: int = 0
    bad_streak: int = 0
    good_weights_step: int = 0
    settings: dict = field(default_factory=dict)
    log_window: dict = field(default_factory=lambda: dict.fromkeys(LOG_WINDOW_KEYS, 0))

    def add_step(self, result, seconds):
        """Count one optimizer step (a `vaswani.training.step.StepResult`) that took `seconds`."""
        self.step += 1
        self.tokens_seen += result.tokens
        self.target_tokens_seen += result.target_tokens
        self.train_seconds += seconds
        self.skipped_steps += result.skipped
        self.bad_streak = 0 if result.finite else self.bad_streak + 1
        self.good_weights_step = self.step - 1 if result.finite else self.good_weights_step
        window = self.log_window
        for key, value in (
            ("tokens", result.tokens),
            ("seconds", seconds),
            ("steps", 1),
            ("skipped", int(result.skipped)),
        ):
            window[key] += value
        if result.finite:  # a skipped step's losses would make the window's average nan
            for key, value in (("loss", result.loss), ("nll", result.nll), ("target_tokens", result.target_tokens)):
                window[key] += value

    def take_log_record(self, learning_rate):
        """The train_log.jsonl line of the steps since the last one (losses per target token, throughput), and a new
        window for the next."""
        window = self.log_window
        per_token = window["target_tokens"] or math.nan  # nan: every step of the window was skipped
        self.log_window = dict.fromkeys(window, 0)
        return {
            "step": self.step,
            "epoch": self.epoch,
            "loss": window["loss"] / per_token,
            "nll": window["nll"] / per_token,
            "lr": learning_rate,
            "tokens": self.tokens_seen,
            "tokens_per_step": window["tokens"] / window["steps"],
            "tokens_per_sec": window["tokens"] / window["seconds"],
            "skipped_steps": window["skipped"],
        }

    @classmethod
    def read(cls, checkpoint):
        """The state saved in a checkpoint. Checkpoints written before the settings were recorded hold the process
        count only."""
        saved = json.loads((Path(checkpoint) / TRAIN_STATE_FILE).read_text())
        saved.pop("interim", None)
        if "settings" not in saved:
            saved["settings"] = {"num_processes": saved.pop("num_processes", None)}
        saved["settings"] = {RENAMED_SETTINGS.get(name, name): value for name, value in saved["settings"].items()}
        return cls(**{key: value for key, value in saved.items() if key in cls.__dataclass_fields__})


def settings_changes(saved, current):
    """The settings that differ between a checkpoint and the run that resumes it, one phrase each."""
    return [
        f"{name} was {saved[name]!r} and is now {value!r}"
        for name, value in current.items()
        if name in saved and saved[name] != value
    ]


def list_checkpoints(checkpoint_root):
    """Complete checkpoints (those holding train_state.json), oldest first."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return []
    found = [
        path for path in root.iterdir() if CHECKPOINT_NAME.match(path.name) and (path / TRAIN_STATE_FILE).is_file()
    ]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path):
    return int(CHECKPOINT_NAME.match(Path(path).name).group(1))


def is_interim(checkpoint):
    """Whether a checkpoint was written off the save grid, by a signal or a test's stop (see save_checkpoint)."""
    return json.loads((Path(checkpoint) / TRAIN_STATE_FILE).read_text()).get("interim", False)


def save_checkpoint(accelerator, model, config, checkpoint_root, state, keep, interim=False):
    """accelerate save_state (weights, optimizer, schedule, random states of every process) plus the train state.

    Written into a temporary folder, flushed to disk and renamed into place; a failed write (a full disk) removes the
    temporary folder and raises what the writer raised (OSError from Python, SafetensorError from safetensors,
    RuntimeError from torch.save).

    `interim` marks a checkpoint written off the save grid (on SIGTERM/SIGINT): the next checkpoint replaces it and
    averaging ignores it, so that a stopped and resumed run keeps the same checkpoints, and averages the same final
    model, as an uninterrupted one. Besides interim ones, the last `keep` checkpoints stay.
    """
    from accelerate.utils import DistributedType
    from accelerate.utils import save as accelerate_save

    final = Path(checkpoint_root) / f"step_{state.step:07d}"
    temporary = Path(checkpoint_root) / f"tmp_{final.name}"
    try:
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(temporary))
        if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            # These save sharded or engine-specific files; averaging reads one plain safetensors file, gathered here,
            # with the shared embedding once (section 3.4), as save_pretrained and plain data parallelism write it.
            tied = accelerator.unwrap_model(model)._tied_weights_keys
            weights = {name: tensor for name, tensor in accelerator.get_state_dict(model).items() if name not in tied}
            accelerate_save(weights, temporary / "model.safetensors", safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            config.to_json_file(temporary / "config.json")
            (temporary / TRAIN_STATE_FILE).write_text(json.dumps({**asdict(state), "interim": interim}, indent=2))
            flush_to_disk(temporary)
            if final.exists():  # a rerun that reached the same step again
                remove_checkpoint(final)
            os.replace(temporary, final)
            flush_to_disk(final.parent)  # the rename itself
    except BaseException:  # a full disk raises OSError, or safetensors' and torch's own errors around it
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)  # give back what the half-written checkpoint took
        raise
    if accelerator.is_main_process:
        checkpoints = list_checkpoints(checkpoint_root)
        regular = [path for path in checkpoints if not is_interim(path)]
        for old in regular[:-keep] + [path for path in checkpoints[:-1] if is_interim(path)]:
            remove_checkpoint(old)
    accelerator.wait_for_everyone()
    return final


def remove_checkpoint(path):
    """Renamed out of the checkpoint names first, so that a kill during the deletion leaves a tmp_ folder (removed at
    the next start), never a checkpoint with train_state.json but without some of its other files."""
    doomed = path.with_name(f"tmp_{path.name}.old")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def remove_leftovers(checkpoint_root):
    """Folders a killed run left half-written or half-deleted."""
    for leftover in Path(checkpoint_root).glob("tmp_step_*"):
        shutil.rmtree(leftover, ignore_errors=True)


def flush_to_disk(folder):
    """fsync the files of `folder` and (POSIX) the folder itself: only then is a rename safe against a crash."""
    folder = Path(folder)
    for path in [path for path in folder.iterdir() if path.is_file()] + ([folder] if os.name == "posix" else []):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def load_checkpoint_weights(path):
    """The model weights of a checkpoint folder (or a .safetensors file), with DDP's "module." prefixes removed."""
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no model.safetensors in checkpoint {path}")
    return {key.removeprefix("module."): tensor for key, tensor in load_file(str(file)).items()}


def average_checkpoints(paths):
    """Section 6.1: the element-wise mean of the weights of several checkpoints, accumulated in float64 and returned
    in each tensor's own dtype."""
    paths = list(paths)
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    total = None
    for path in paths:
        weights = load_checkpoint_weights(path)
        if total is None:
            dtypes = {key: tensor.dtype for key, tensor in weights.items()}
            total = {key: tensor.to(torch.float64) for key, tensor in weights.items()}
            continue
        if weights.keys() != total.keys():
            raise ValueError(
                f"checkpoint {path} holds different tensors than {paths[0]}: "
                f"{sorted(weights.keys() ^ total.keys())[:5]}"
            )
        for key, tensor in weights.items():
            if tensor.shape != total[key].shape:
                raise ValueError(
                    f"{key} has shape {tuple(tensor.shape)} in {path} but {tuple(total[key].shape)} in {paths[0]}"
                )
            total[key] += tensor.to(torch.float64)
    return {key: (tensor / len(paths)).to(dtypes[key]) for key, tensor in total.items()}


def load_weights_into(model, state_dict):
    """Load a saved state dict; only the weights tied to the shared embedding may be absent from it (section 3.4)."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"checkpoint does not fit the model: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.tie_weights()
    return model


def weights_checksum(model):
    """A SHA-256 of all weights, to show that every process ends with the same model."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_checkpoint_fits(path, model_class, config):
    """Before anything is loaded: the checkpoint holds its weights as safetensors (accelerate would fall back to a
    pickle, pytorch_model.bin), with exactly the tensors, by name and shape, of the model `config` builds."""
    path = Path(path)
    if not (path / "model.safetensors").is_file():
        raise UsageError(
            f"checkpoint {path} has no model.safetensors; it cannot be resumed (weights are only read "
            "from safetensors files)."
        )
    with torch.device("meta"):
        model = model_class(config)
    expected = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as file:
            saved = {key.removeprefix("module."): tuple(file.get_slice(key).get_shape()) for key in file.keys()}
    except Exception as error:  # safetensors raises its own error for a damaged header
        raise UsageError(f"cannot read {path / 'model.safetensors'} ({error}).") from error
    problems = [
        f"{key} is {saved[key]} in the checkpoint but {expected[key]} in the model"
        for key in sorted(saved.keys() & expected.keys())
        if saved[key] != expected[key]
    ]
    problems += [f"{key} is missing from the checkpoint" for key in sorted(expected.keys() - saved.keys() - tied)]
    problems += [f"{key} is not in the model" for key in sorted(saved.keys() - expected.keys())]
    if problems:
        raise UsageError(
            f"checkpoint {path} does not fit the model of its config.json ({len(problems)} tensors "
            "differ: " + "; ".join(problems[:6]) + ("; ..." if len(problems) > 6 else "") + ")."
        )
