"""Train the Transformer with the recipe of "Attention Is All You Need", section 5, through Hugging Face Accelerate.

Read top to bottom, this file follows the paper:
  5.1  data: sentence pairs batched by approximate length, each batch holding a set number of tokens
       rather than a set number of sentences (vaswani.training.data: the corpus is tokenized once into Arrow files
       cached next to the dataset, which every process and every later run memory-maps);
  5.2  hardware and schedule: one optimizer step per batch, `--max_steps` of them (base: 100k, big: 300k);
  5.3  optimizer: Adam(beta1=0.9, beta2=0.98, eps=1e-9) with the warmup-then-inverse-square-root learning rate;
  5.4  regularisation: dropout (from the preset) and label smoothing 0.1;
  6.1  the last checkpoints are averaged into the final model, which is scored with BLEU (scripts/evaluate.py).

One process:
  python scripts/train.py --dataset_dir DIR --tokenizer TOK --preset small --output_dir OUT --max_steps 1000
Several processes or machines (data parallel; see configs/README.md):
  accelerate launch [--config_file configs/multi_gpu.yaml] scripts/train.py --dataset_dir DIR ... --output_dir OUT
Continue a stopped run where it stopped (step, optimizer, schedule, data position, random states):
  python scripts/train.py ... --output_dir OUT --resume

Faults (docs/reliability.md): SIGTERM or SIGINT (preemption, Ctrl-C) finishes the optimizer step under way, writes a
checkpoint and exits with 143 / 130, printing the command that resumes; a kill at any other moment loses only the
steps since the last checkpoint; a non-finite loss skips its step, and --max_bad_steps of them in a row stop the run;
an unwritable --output_dir or a disk too small for the checkpoints is an error before training starts.

OUT receives: checkpoints/step_XXXXXXX (accelerate save_state, the last --keep_checkpoints of them), logs/
(TensorBoard), train_log.jsonl, and at the end the averaged model (config.json, model.safetensors,
generation_config.json, the tokenizer), training_curves.png, lr_schedule.png and training_summary.json.
"""

import argparse
import hashlib
import json
import logging
import math
import os
import platform
import re
import shlex
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs, ProjectConfiguration, gather_object, set_seed
from accelerate.utils import save as accelerate_save
from safetensors import safe_open
from safetensors.torch import load_file
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from vaswani import PRESETS, VaswaniConfig, VaswaniForConditionalGeneration, label_smoothed_cross_entropy
from vaswani.training.data import (
    PairCollator,
    TokenBucketSampler,
    load_translation_dataset,
    pair_loader,
    tokenize_split,
    tokenizer_fingerprint,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluate import corpus_bleu, translate  # noqa: E402  (scripts/evaluate.py: one way to decode and to score)
from push_to_hub import PushError, push_to_hub  # noqa: E402  (scripts/push_to_hub.py: one way to share a model)

# accelerate warns at every save that it leaves out the tied copies of the shared embedding (section 3.4); that is
# intended, and load_weights_into() checks that nothing else is missing.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)

CHECKPOINT_NAME = re.compile(r"^step_(\d{7})$")
# The flags that decide the sequence of steps: which batches, in which order, with which random streams, learning
# rates and updates. A resumed run continues exactly only with the values its checkpoint was written with
# (--max_steps, checkpointing, validation, logging and data-loader workers may change).
STEP_SETTINGS = ("batch_tokens", "grad_accum", "seed", "preset", "dropout", "attention_dropout", "source_lang",
                 "target_lang", "max_source_length", "max_target_length", "long_pairs", "lr_schedule", "warmup_steps",
                 "lr_scale", "peak_lr", "adam_beta1", "adam_beta2", "adam_eps", "label_smoothing", "max_grad_norm")
TRAIN_STATE_FILE = "train_state.json"  # written last into a checkpoint: its presence marks the checkpoint complete


def fail(message):
    """Stop with a message that says what is wrong and what to do, before any time is spent training."""
    raise SystemExit(f"train.py: error: {message}")


# ---------------------------------------------------------------------------------------------------------------------
# Command line. The defaults are the paper's base model on 8 GPUs (Table 3, sections 5.1-5.4); configs/README.md
# and the README give the flags for a small run on a CPU.
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data (section 5.1)")
    data.add_argument("--dataset_dir", required=True, help="DatasetDict saved by scripts/prepare_data.py")
    data.add_argument("--tokenizer", required=True, help="tokenizer folder saved by scripts/train_tokenizer.py")
    data.add_argument("--source_lang", default="en")
    data.add_argument("--target_lang", default="es")
    data.add_argument("--max_source_length", type=int, default=256, help="longest source, in tokens with </s>")
    data.add_argument("--max_target_length", type=int, default=256, help="longest target, in tokens with </s>")
    data.add_argument("--long_pairs", choices=["filter", "truncate"], default="filter",
                      help="what to do with training pairs longer than the maximum lengths")
    data.add_argument("--batch_tokens", type=int, default=6250,
                      help="padded source+target tokens per batch and process (paper: 25000+25000 over 8 GPUs)")
    data.add_argument("--grad_accum", type=int, default=1,
                      help="batches accumulated into one optimizer step, to reach the paper's tokens per step")
    data.add_argument("--num_proc", type=int, default=min(os.cpu_count() or 1, 16),
                      help="processes that tokenize the corpus the first time (the result is cached next to it)")
    data.add_argument("--dataloader_num_workers", type=int, default=0,
                      help="worker processes that read and pad the next batches while the model trains (a GPU "
                           "wants 2 or more; on a CPU they compete with training for the cores)")

    model = parser.add_argument_group("model (Table 3)")
    model.add_argument("--preset", choices=sorted(PRESETS), default="base")
    model.add_argument("--dropout", type=float, default=None, help="P_drop (section 5.4); default: the preset's")
    model.add_argument("--attention_dropout", type=float, default=None, help="default: the config's (0)")

    optim = parser.add_argument_group("optimizer and schedule (sections 5.2, 5.3)")
    optim.add_argument("--max_steps", type=int, default=100_000, help="optimizer steps (base: 100k, big: 300k)")
    optim.add_argument("--lr_schedule", choices=["paper", "short"], default="paper",
                       help="paper: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); short: the same shape "
                            "scaled to peak at --peak_lr, for runs of a few hundred steps")
    optim.add_argument("--warmup_steps", type=int, default=4000)
    optim.add_argument("--lr_scale", type=float, default=1.0, help="multiplies the paper schedule")
    optim.add_argument("--peak_lr", type=float, default=1e-3, help="peak of the short schedule")
    optim.add_argument("--adam_beta1", type=float, default=0.9)
    optim.add_argument("--adam_beta2", type=float, default=0.98)
    optim.add_argument("--adam_eps", type=float, default=1e-9)
    optim.add_argument("--label_smoothing", type=float, default=0.1, help="epsilon_ls (section 5.4)")
    optim.add_argument("--max_grad_norm", type=float, default=0.0, help="clip gradients to this norm; 0: off, "
                                                                         "as in the paper")
    optim.add_argument("--seed", type=int, default=0)
    optim.add_argument("--max_bad_steps", type=int, default=10,
                       help="stop after this many steps in a row with a non-finite loss (each is skipped: no update)")

    hardware = parser.add_argument_group("hardware")
    hardware.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default=None,
                          help="default: what `accelerate launch` / the accelerate config says (else no)")
    hardware.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    hardware.add_argument("--ddp_timeout", type=int, default=1800,
                          help="seconds a process waits for the others, e.g. while the main process tokenizes the "
                               "corpus the first time (as transformers' TrainingArguments.ddp_timeout)")

    output = parser.add_argument_group("checkpoints and output (section 6.1)")
    output.add_argument("--output_dir", required=True)
    output.add_argument("--save_every", type=int, default=1000, help="steps between checkpoints")
    output.add_argument("--keep_checkpoints", type=int, default=5, help="how many recent checkpoints to keep")
    output.add_argument("--average_last", type=int, default=5,
                        help="average the last K checkpoints into the final model (paper: 5 base, 20 big); 1: none")
    output.add_argument("--resume", nargs="?", const="latest", default=None,
                        help="continue from the latest complete checkpoint in OUTPUT_DIR (or from this folder)")
    output.add_argument("--resume_with_changes", action="store_true",
                        help="resume although settings that decide the steps (batches, data, random streams, "
                             "learning rates) differ from the checkpoint's; the run then no longer continues exactly")
    output.add_argument("--stop_after", type=int, default=None,
                        help="checkpoint and exit after this step, as if killed there (for testing --resume)")
    output.add_argument("--push_to_hub", action="store_true",
                        help="at the end, upload the final model with scripts/push_to_hub.py (one commit)")
    output.add_argument("--hub_model_id", default=None, help="NAMESPACE/NAME of the Hub repo for --push_to_hub")
    output.add_argument("--hub_private_repo", action="store_true", help="create the Hub repo as private")

    evaluation = parser.add_argument_group("validation")
    evaluation.add_argument("--eval_every", type=int, default=1000, help="steps between validations; 0: only at "
                                                                          "the end")
    evaluation.add_argument("--eval_bleu_samples", type=int, default=500,
                            help="BLEU on the first N validation pairs; 0: no BLEU")
    evaluation.add_argument("--eval_num_beams", type=int, default=1, help="1: greedy decoding; 4: the paper's beam")
    evaluation.add_argument("--eval_length_penalty", type=float, default=0.6)
    evaluation.add_argument("--eval_batch_size", type=int, default=64, help="sentences per generate() call")
    evaluation.add_argument("--log_every", type=int, default=50, help="steps between training-loss log lines")
    evaluation.add_argument("--report_to", choices=["tensorboard", "none"], default="tensorboard")
    args = parser.parse_args(argv)
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id NAMESPACE/NAME")

    for name in ("batch_tokens", "grad_accum", "max_steps", "warmup_steps", "save_every", "keep_checkpoints",
                 "average_last", "log_every", "eval_num_beams", "eval_batch_size", "max_source_length",
                 "max_target_length", "max_bad_steps", "num_proc", "ddp_timeout"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if not 0.0 <= args.label_smoothing < 1.0:
        parser.error("--label_smoothing must be in [0, 1)")
    if args.dataloader_num_workers < 0:
        parser.error("--dataloader_num_workers must be at least 0")
    return args


# ---------------------------------------------------------------------------------------------------------------------
# Section 5.1, training data: pairs tokenized once with the shared vocabulary (vaswani.training.data), batched by
# approximate length so that each batch holds about --batch_tokens tokens.
# ---------------------------------------------------------------------------------------------------------------------


def load_and_check_tokenizer(path):
    """The shared source-target tokenizer; it must define <pad>, <s>, </s> and end every sequence with </s>."""
    if not Path(path).exists():
        fail(f"--tokenizer {path} does not exist; create it with scripts/train_tokenizer.py --output_dir {path}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:
        fail(f"cannot load a tokenizer from --tokenizer {path} ({error}).")
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name) is None:
            fail(f"the tokenizer in {path} has no {name.replace('_id', '')}; the model needs <pad>, <s> (the decoder "
                 "start) and </s>.")
    sample = tokenizer(["a"], text_target=["a"])
    if sample["labels"][0][-1] != tokenizer.eos_token_id or sample["input_ids"][0][-1] != tokenizer.eos_token_id:
        fail(f"the tokenizer in {path} does not end sequences with </s> (id {tokenizer.eos_token_id}); without it "
             "the model never learns to stop. Give it a post-processor that appends </s>.")
    return tokenizer


def check_config_matches_tokenizer(config, tokenizer, where):
    """The embedding matrix and the special ids must be the tokenizer's, or every id means something else."""
    problems = []
    if config.vocab_size != len(tokenizer):
        problems.append(f"vocab_size is {config.vocab_size} but the tokenizer has {len(tokenizer)} tokens")
    for field, token_id in (("pad_token_id", tokenizer.pad_token_id), ("bos_token_id", tokenizer.bos_token_id),
                            ("eos_token_id", tokenizer.eos_token_id),
                            ("decoder_start_token_id", tokenizer.bos_token_id)):
        if getattr(config, field) != token_id:
            problems.append(f"{field} is {getattr(config, field)} but the tokenizer's is {token_id}")
    if problems:
        fail(f"the tokenizer does not match the model configuration of {where}: " + "; ".join(problems) + ".")


# ---------------------------------------------------------------------------------------------------------------------
# Section 5.3, the learning rate, and section 5.4, the label-smoothed loss.
# ---------------------------------------------------------------------------------------------------------------------


def lr_at(step, schedule="paper", d_model=512, warmup_steps=4000, lr_scale=1.0, peak_lr=1e-3):
    """Learning rate of optimizer step `step` (counted from 1).

    "paper", equation 3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), times `lr_scale`:
    linear warmup, then decay proportional to the inverse square root of the step. It peaks at
    (d_model * warmup_steps)^-0.5, 7e-4 for the base model with 4000 warmup steps.
    "short": the same shape scaled to peak at `peak_lr`, for runs whose warmup is a few hundred steps, where the
    paper's formula would peak far higher (5e-3 at d_model=256 with 150 warmup steps) and a small model stalls.
    """
    step = max(step, 1)
    if schedule == "paper":
        return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    if schedule == "short":
        return peak_lr * min(step / warmup_steps, (warmup_steps / step) ** 0.5)
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


def token_loss_sums(logits, labels, label_smoothing):
    """Section 5.4: the cross-entropy against targets smoothed with epsilon_ls (differentiable) and the plain
    cross-entropy (to log), each summed over the labelled tokens, from one pass over the logits.

    Summed, not averaged, so that the caller can divide by the target tokens of the whole optimizer step (all
    accumulated batches on all processes): every token weighs the same however the step was cut into batches.
    """
    smoothed, plain = label_smoothed_cross_entropy(logits, labels, label_smoothing)
    return smoothed.sum(), plain.sum()


# ---------------------------------------------------------------------------------------------------------------------
# Checkpoints and section 6.1's checkpoint averaging.
# ---------------------------------------------------------------------------------------------------------------------


def list_checkpoints(checkpoint_root):
    """Complete checkpoints (those holding train_state.json), oldest first."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir()
             if CHECKPOINT_NAME.match(path.name) and (path / TRAIN_STATE_FILE).is_file()]
    return sorted(found, key=lambda path: int(CHECKPOINT_NAME.match(path.name).group(1)))


def is_interim(checkpoint):
    """Whether a checkpoint was written off the --save_every grid, by a signal or --stop_after (see save_checkpoint)."""
    return json.loads((Path(checkpoint) / TRAIN_STATE_FILE).read_text()).get("interim", False)


def save_checkpoint(accelerator, model, config, checkpoint_root, train_state, keep, interim=False):
    """accelerate save_state (weights, optimizer, schedule, random states of every process) plus our train state.

    Written into a temporary folder, flushed to disk and renamed into place, so that a run killed at any moment (even
    by SIGKILL or a power cut) leaves no folder that --resume could take for a checkpoint; train_state.json is written
    last as the completeness mark. A failed write (a full disk) removes the temporary folder and raises what the
    writer raised (OSError from Python, SafetensorError from safetensors, RuntimeError from torch.save).

    `interim` marks a checkpoint written off the --save_every grid (on SIGTERM/SIGINT, or at --stop_after): the
    next checkpoint replaces it and averaging ignores it, so that a stopped and resumed run keeps the same
    checkpoints, and averages the same final model, as an uninterrupted one. Besides interim ones, the last `keep`
    checkpoints stay.
    """
    final = Path(checkpoint_root) / f"step_{train_state['step']:07d}"
    temporary = Path(checkpoint_root) / f"tmp_{final.name}"
    try:
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(temporary))
        if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            # These save sharded or engine-specific files; averaging reads one plain safetensors file, gathered here.
            accelerate_save(accelerator.get_state_dict(model), temporary / "model.safetensors", safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            config.to_json_file(temporary / "config.json")
            (temporary / TRAIN_STATE_FILE).write_text(json.dumps({**train_state, "interim": interim}, indent=2))
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
    """Section 6.1: the element-wise mean of the weights of several checkpoints ("we used a single model obtained by
    averaging the last 5 checkpoints"). Accumulated in float64, returned in each tensor's own dtype."""
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
            raise ValueError(f"checkpoint {path} holds different tensors than {paths[0]}: "
                             f"{sorted(weights.keys() ^ total.keys())[:5]}")
        for key, tensor in weights.items():
            if tensor.shape != total[key].shape:
                raise ValueError(f"{key} has shape {tuple(tensor.shape)} in {path} but {tuple(total[key].shape)} "
                                 f"in {paths[0]}")
            total[key] += tensor.to(torch.float64)
    return {key: (tensor / len(paths)).to(dtypes[key]) for key, tensor in total.items()}


def load_weights_into(model, state_dict):
    """Load a saved state dict; only the weights tied to the shared embedding may be absent from it (section 3.4)."""
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    if unexpected or set(missing) - tied:
        raise ValueError(f"checkpoint does not fit the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")
    model.tie_weights()
    return model


def weights_checksum(model):
    """A SHA-256 of all weights, to show that every process ends with the same model."""
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------------------------
# Faults (docs/reliability.md): preemption signals, checkpoints that do not fit, disks too small for the checkpoints.
# ---------------------------------------------------------------------------------------------------------------------


class StopSignal:
    """SIGTERM (cluster preemption, `kill`) and SIGINT (Ctrl-C) ask the run to stop after the optimizer step under way.

    The handler only records the signal. At the end of each step every process votes (stop or not) in the all-reduce
    the step does anyway, so all processes stop after the same step however the signal reached them; the run then
    checkpoints and exits with 128 + the signal number (143 for SIGTERM, 130 for SIGINT), as a shell reports a
    process ended by the signal, so that a job scheduler sees an unfinished run. A second Ctrl-C stops at once,
    losing the steps since the last checkpoint but never a checkpoint.
    """

    def __init__(self):
        self.received = None
        self.previous = {sig: signal.signal(sig, self.record) for sig in (signal.SIGTERM, signal.SIGINT)}

    def record(self, signum, frame):
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = self.received or signum

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def resume_command(argv):
    """The command that continues this run: the same arguments, with --resume (the latest checkpoint) once."""
    kept, i = [], 0
    while i < len(argv):
        if argv[i] == "--resume":  # with or without a checkpoint folder after it
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1
            continue
        if not argv[i].startswith("--resume="):
            kept.append(argv[i])
        i += 1
    script = shlex.join([os.path.relpath(__file__), *kept, "--resume"])
    if "ACCELERATE_MIXED_PRECISION" in os.environ:  # started by `accelerate launch`
        return f"accelerate launch <the same launch options> {script}"
    return f"{shlex.quote(sys.executable)} {script}"


def too_many_bad_steps(state, max_bad_steps, checkpoint_root):
    """The error that ends a run whose loss stayed non-finite, naming the last checkpoint with good weights: the
    newest one not after the weights that last gave a finite loss (the update that followed was never scored)."""
    good = [path for path in list_checkpoints(checkpoint_root) if int(path.name[5:]) <= state["good_weights_step"]]
    return (f"train.py: error: the loss was not finite for {state['bad_streak']} steps in a row; stopped at step "
            f"{state['step']} (--max_bad_steps {max_bad_steps}). The weights of step {state['good_weights_step']} "
            "are the last known to give a finite loss: "
            + (f"the last good checkpoint is {good[-1]}. Continue from it with --resume {good[-1]} " if good
               else "no checkpoint holds them. Start again ")
            + "after lowering the learning rate (--peak_lr / --lr_scale) or with --max_grad_norm.")


def check_checkpoint_fits(path, config):
    """Before anything is loaded: the checkpoint holds its weights as safetensors (accelerate would fall back to a
    pickle, pytorch_model.bin), with exactly the tensors, by name and shape, of the model this command builds."""
    if not (path / "model.safetensors").is_file():
        fail(f"checkpoint {path} has no model.safetensors; it cannot be resumed (weights are only read from "
             "safetensors files).")
    with torch.device("meta"):
        model = VaswaniForConditionalGeneration(config)
    expected = {key: tuple(tensor.shape) for key, tensor in model.state_dict().items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt") as file:
            saved = {key.removeprefix("module."): tuple(file.get_slice(key).get_shape()) for key in file.keys()}
    except Exception as error:  # safetensors raises its own error for a damaged header
        fail(f"cannot read {path / 'model.safetensors'} ({error}).")
    problems = [f"{key} is {saved[key]} in the checkpoint but {expected[key]} in the model"
                for key in sorted(saved.keys() & expected.keys()) if saved[key] != expected[key]]
    problems += [f"{key} is missing from the checkpoint" for key in sorted(expected.keys() - saved.keys() - tied)]
    problems += [f"{key} is not in the model" for key in sorted(saved.keys() - expected.keys())]
    if problems:
        fail(f"checkpoint {path} does not fit the model of its config.json ({len(problems)} tensors differ: "
             + "; ".join(problems[:6]) + ("; ..." if len(problems) > 6 else "") + ").")


def check_free_space(output_dir, config, keep, existing):
    """Fail now, not at the first checkpoint hours from now, if the disk cannot hold the checkpoints of the run.

    One checkpoint holds the float32 weights (4 bytes a parameter) and Adam's two moments (8 bytes), plus 10% and a
    MiB for the schedule, random states and format overhead. Up to `keep` + 1 are on disk at once (the newest is
    complete before the oldest goes), `existing` of which are there already (at least one more is always written),
    and the final model needs 4 bytes a parameter more.
    """
    with torch.device("meta"):
        parameters = VaswaniForConditionalGeneration(config).num_parameters()
    checkpoint_bytes = int(parameters * (4 + 8) * 1.1) + 2**20
    needed = max(keep + 1 - existing, 1) * checkpoint_bytes + parameters * 4
    free = shutil.disk_usage(output_dir).free
    if free < needed:
        fail(f"--output_dir {output_dir} has {free / 1e6:,.0f} MB free, but the run needs about "
             f"{needed / 1e6:,.0f} MB: up to {keep + 1} checkpoints of {checkpoint_bytes / 1e6:,.0f} MB "
             f"({parameters:,} parameters x 12 bytes of weights and Adam moments) and the final model. Free some "
             "space, lower --keep_checkpoints / --average_last, or choose another --output_dir.")
    return needed


# ---------------------------------------------------------------------------------------------------------------------
# Validation: cross-entropy per target token (no smoothing) on the whole validation split, and BLEU of the first
# --eval_bleu_samples pairs, both shared out over the processes.
# ---------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def validate(accelerator, model, tokenizer, valid_loader, bleu_pairs, args):
    """`valid_loader` gives this process its share of the validation batches; `bleu_pairs` are the (sources,
    references) of the pairs scored with BLEU."""
    was_training = model.training
    model.eval()
    rank, world = accelerator.process_index, accelerator.num_processes
    totals = torch.zeros(2, dtype=torch.float64, device=accelerator.device)  # loss sum, target tokens
    for batch in valid_loader:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.autocast():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           decoder_input_ids=batch["decoder_input_ids"]).logits
        totals[0] += token_loss_sums(logits, batch["labels"], 0.0)[1].double()
        totals[1] += batch["labels"].ne(-100).sum()
    totals = accelerator.reduce(totals, reduction="sum")
    result = {"val_loss": (totals[0] / totals[1]).item()}
    result["val_ppl"] = math.exp(min(result["val_loss"], 50.0))

    sources, references = bleu_pairs
    count = len(sources)
    if count:
        share = math.ceil(count / world)
        mine = list(range(rank * share, min((rank + 1) * share, count)))
        with accelerator.autocast():
            hypotheses = translate(model, tokenizer, [sources[i] for i in mine], batch_size=args.eval_batch_size,
                                   num_beams=args.eval_num_beams, length_penalty=args.eval_length_penalty,
                                   max_source_length=args.max_source_length)
        hypotheses = gather_object(hypotheses)  # in process order, so in the order of the pairs
        score, signature = corpus_bleu(hypotheses, references)
        result.update(bleu=score.score, bleu_signature=signature, example=hypotheses[0])
    model.train(was_training)
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Logs and plots a person can read without TensorBoard.
# ---------------------------------------------------------------------------------------------------------------------


def read_jsonl(path):
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path, record):
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def write_plots(output_dir, args, d_model):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(output_dir / "train_log.jsonl")
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r and not r.get("final")]
    fig, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    loss_axis.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss (label-smoothed)")
    loss_axis.plot([r["step"] for r in train], [r["nll"] for r in train], label="train cross-entropy")
    loss_axis.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="validation cross-entropy")
    loss_axis.set(xlabel="step", ylabel="nats per target token", title="Loss")
    loss_axis.legend()
    loss_axis.grid(alpha=0.3)
    bleu_points = [r for r in evals if "bleu" in r]
    bleu_axis.plot([r["step"] for r in bleu_points], [r["bleu"] for r in bleu_points], "o-", color="tab:green")
    for final in (r for r in records if r.get("final")):  # the averaged model, section 6.1
        loss_axis.plot(final["step"], final["val_loss"], "*", markersize=12, color="tab:red",
                       label="averaged model, validation")
        loss_axis.legend()
        if "bleu" in final:
            bleu_axis.plot(final["step"], final["bleu"], "*", markersize=12, color="tab:red", label="averaged model")
            bleu_axis.legend()
    bleu_axis.set(xlabel="step", ylabel="BLEU", title=f"Validation BLEU (first {args.eval_bleu_samples} pairs)")
    bleu_axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output_dir / "training_curves.png", dpi=120)
    plt.close(fig)

    steps = np.unique(np.linspace(1, args.max_steps, min(args.max_steps, 2000)).astype(int))
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, [lr_at(s, args.lr_schedule, d_model, args.warmup_steps, args.lr_scale, args.peak_lr)
                      for s in steps], label=f"{args.lr_schedule} schedule")
    axis.plot([r["step"] for r in train], [r["lr"] for r in train], ".", markersize=3, label="logged")
    axis.axvline(args.warmup_steps, color="gray", linestyle=":", label=f"warmup_steps = {args.warmup_steps}")
    axis.set(xlabel="step", ylabel="learning rate", title="Learning rate (section 5.3)")
    axis.legend()
    axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output_dir / "lr_schedule.png", dpi=120)
    plt.close(fig)


def hardware_description(accelerator):
    device = accelerator.device
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
    return {"device": str(device), "device_name": name, "num_processes": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type).split(".")[-1],
            "mixed_precision": accelerator.mixed_precision, "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count()}


# ---------------------------------------------------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------------------------------------------------


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(argument) for argument in argv]
    args = parse_args(argv)
    wall_start = time.time()
    output_dir = Path(args.output_dir)
    checkpoint_root = output_dir / "checkpoints"
    print_once = print if int(os.environ.get("RANK", "0")) == 0 else (lambda *_: None)

    # --- Checks that would otherwise fail hours later; done before any process group starts. ---
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write_test_{os.environ.get('RANK', '0')}_{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        fail(f"cannot write to --output_dir {output_dir} ({error}).")
    if args.resume is None and list_checkpoints(checkpoint_root):
        fail(f"{checkpoint_root} already holds checkpoints of an earlier run; pass --resume to continue it, or "
             "choose another --output_dir.")
    try:
        dataset = load_translation_dataset(args.dataset_dir, args.source_lang, args.target_lang)
    except ValueError as error:
        fail(str(error))
    tokenizer = load_and_check_tokenizer(args.tokenizer)

    # --- The model configuration: a preset of Table 3, with the tokenizer's vocabulary size and special ids. ---
    overrides = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                 "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                 "decoder_start_token_id": tokenizer.bos_token_id}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    if args.attention_dropout is not None:
        overrides["attention_dropout"] = args.attention_dropout
    config = VaswaniConfig.from_preset(args.preset, **overrides)
    longest = max(args.max_source_length, args.max_target_length) + 51  # decoding runs to source length + 50
    if longest > config.max_position_embeddings:
        config.max_position_embeddings = longest  # sinusoidal encodings: no weights depend on this (section 3.5)

    resume_from = None
    if args.resume is not None:
        candidates = list_checkpoints(checkpoint_root) if args.resume == "latest" else [Path(args.resume)]
        if args.resume != "latest" and not (candidates[0] / TRAIN_STATE_FILE).is_file():
            fail(f"--resume {args.resume} is not a complete checkpoint (no {TRAIN_STATE_FILE}).")
        if candidates:
            resume_from = candidates[-1]
            if not (resume_from / "config.json").is_file():
                fail(f"checkpoint {resume_from} has no config.json; it cannot be resumed.")
            saved = VaswaniConfig.from_json_file(str(resume_from / "config.json"))
            check_config_matches_tokenizer(saved, tokenizer, f"checkpoint {resume_from}")
            for field in ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                          "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "dropout",
                          "attention_dropout"):
                if getattr(saved, field) != getattr(config, field):
                    fail(f"checkpoint {resume_from} was trained with {field}={getattr(saved, field)}, but this "
                         f"command asks for {getattr(config, field)}; resume with the original --preset/--dropout.")
            config = saved
            check_checkpoint_fits(resume_from, config)
        else:
            print_once(f"--resume: no checkpoint in {checkpoint_root} yet, starting from scratch.")
    check_config_matches_tokenizer(config, tokenizer, f"preset {args.preset!r}")
    keep = max(args.keep_checkpoints, args.average_last)
    check_free_space(output_dir, config, keep, len(list_checkpoints(checkpoint_root)))

    # Accelerate picks up what `accelerate launch` set: the number of processes, DDP / FSDP / DeepSpeed, precision.
    # Without a GPU, cpu=True lets several launched processes train together over gloo.
    accelerator = Accelerator(
        cpu=args.cpu or not torch.accelerator.is_available(),
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.grad_accum,
        step_scheduler_with_optimizer=False,  # our schedule steps once per optimizer step, whatever the process count
        log_with=None if args.report_to == "none" else args.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir)),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=args.ddp_timeout))],
    )
    main_process = accelerator.is_main_process
    say = accelerator.print

    # --- Data (section 5.1): tokenized once into Arrow next to the dataset, then memory-mapped by every process. ---
    def tokenize(split, long_pairs):
        return tokenize_split(dataset[split], tokenizer, args.source_lang, args.target_lang, args.max_source_length,
                              args.max_target_length, long_pairs, num_proc=args.num_proc)

    # The main process tokenizes first; then the first process of every other machine, which finds the files on a
    # shared file system and otherwise builds its machine's own copy; then all the others, which map the files.
    train = valid = None
    for my_turn in (accelerator.is_main_process, accelerator.is_local_main_process, True):
        if my_turn and train is None:
            train, valid = tokenize("train", args.long_pairs), tokenize("validation", "truncate")
        accelerator.wait_for_everyone()
    if not len(train):
        fail(f"no training pair fits --max_source_length {args.max_source_length} / --max_target_length "
             f"{args.max_target_length} ({train.without_text} of them are not text).")
    if not len(valid):
        fail("the validation split has no pair with text on both sides.")
    def bucket_sampler(split, name, **options):
        try:
            return TokenBucketSampler(split.source_lengths, split.target_lengths, args.batch_tokens,
                                      num_replicas=accelerator.num_processes, rank=accelerator.process_index, **options)
        except ValueError as error:
            fail(f"--batch_tokens {args.batch_tokens}, {name} split: {error}")

    sampler = bucket_sampler(train, "training", seed=args.seed, batches_per_step=args.grad_accum)
    valid_sampler = bucket_sampler(valid, "validation", shuffle=False, drop_remainder=False)
    steps_per_epoch = sampler.batches_in_epoch(0) // args.grad_accum
    if steps_per_epoch == 0:
        fail(f"the training split makes fewer batches of --batch_tokens {args.batch_tokens} than processes x "
             f"--grad_accum ({accelerator.num_processes} x {args.grad_accum}); lower --batch_tokens or --grad_accum.")
    collator = PairCollator(config.pad_token_id, config.decoder_start_token_id)
    train_loader = pair_loader(train, sampler, collator, num_workers=args.dataloader_num_workers)
    valid_loader = pair_loader(valid, valid_sampler, collator)
    bleu_rows = valid.rows[:args.eval_bleu_samples].tolist()
    bleu_texts = dataset["validation"].select(bleu_rows)["translation"] if bleu_rows else []
    bleu_pairs = ([pair[args.source_lang] for pair in bleu_texts], [pair[args.target_lang] for pair in bleu_texts])
    say(f"train: {len(train)} pairs ({train.too_long} longer than the maximum lengths dropped, "
        f"{train.truncated} truncated, {train.without_text} without text dropped); validation: "
        f"{len(valid)} pairs ({valid.without_text} without text dropped); tokenized "
        + ("earlier, read from the cache" if train.from_cache else "now and cached") + " next to the dataset")
    say(f"batches of <= {args.batch_tokens} padded tokens x {args.grad_accum} accumulated x "
        f"{accelerator.num_processes} processes = <= {args.batch_tokens * args.grad_accum * accelerator.num_processes}"
        f" tokens per optimizer step (paper: ~25000 source + ~25000 target); {steps_per_epoch} steps per epoch")

    # --- Model, optimizer (section 5.3) and schedule. ---
    set_seed(args.seed)  # the same initial weights on every process
    model = VaswaniForConditionalGeneration(config)
    say(f"model: preset {args.preset}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
        f"d_model {config.d_model}, dropout {config.dropout}, vocabulary {config.vocab_size}")
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(args.adam_beta1, args.adam_beta2),
                                 eps=args.adam_eps)

    def schedule(scheduler_step):  # LambdaLR counts from 0; the paper's step_num from 1
        return lr_at(scheduler_step + 1, args.lr_schedule, config.d_model, args.warmup_steps, args.lr_scale,
                     args.peak_lr)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    if accelerator.state.deepspeed_plugin is not None:  # batches are counted in tokens; DeepSpeed wants a number
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.gradient_accumulation_steps != args.grad_accum:
        fail(f"the accelerate config accumulates {accelerator.gradient_accumulation_steps} batches but --grad_accum "
             f"is {args.grad_accum}; make them agree.")

    # --- Where to start: step 0, or exactly where a checkpoint left off. ---
    # skipped_steps: steps without an update (non-finite loss, fp16 overflow); bad_streak: non-finite losses in a
    # row; good_weights_step: the weights after this step were the last to give a finite loss (known to be good).
    settings = {**{name: getattr(args, name) for name in STEP_SETTINGS}, "num_processes": accelerator.num_processes,
                "mixed_precision": accelerator.mixed_precision, "dataset": dataset["train"]._fingerprint,
                "tokenizer": tokenizer_fingerprint(tokenizer)}
    state = {"step": 0, "epoch": 0, "batch_index": 0, "tokens_seen": 0, "target_tokens_seen": 0,
             "train_seconds": 0.0, "skipped_steps": 0, "bad_streak": 0, "good_weights_step": 0, "settings": settings}
    window = {"loss": 0.0, "nll": 0.0, "target_tokens": 0, "tokens": 0, "seconds": 0.0, "steps": 0, "skipped": 0}
    log_path = output_dir / "train_log.jsonl"
    set_seed(args.seed, device_specific=True)  # a different dropout stream on each process
    if resume_from is not None:
        saved_state = json.loads((resume_from / TRAIN_STATE_FILE).read_text())
        # Checkpoints written before the settings were recorded hold the process count only.
        saved = saved_state.pop("settings", {"num_processes": saved_state.pop("num_processes", None)})
        changes = [f"{name} was {saved[name]!r} and is now {value!r}" for name, value in settings.items()
                   if name in saved and saved[name] != value]
        if changes and not args.resume_with_changes:
            fail(f"checkpoint {resume_from} was written with other settings that decide the steps: "
                 + "; ".join(changes) + ". Resume with those, or pass --resume_with_changes to continue anyway "
                 "(the run is then no longer the one an uninterrupted run would have been).")
        if changes:
            say("warning: resuming with changed settings (--resume_with_changes): " + "; ".join(changes))
        try:  # weights, Adam moments, schedule, every process's RNG states
            accelerator.load_state(str(resume_from))
        except Exception as error:  # a damaged file, or a pickle holding more than tensors (read with weights_only)
            fail(f"cannot load checkpoint {resume_from} ({type(error).__name__}: {error}).")
        window = saved_state.pop("log_window", window)  # the steps since the last log line, for the next one
        saved_state.pop("interim", None)
        state.update(saved_state)
        say(f"resumed from {resume_from}: step {state['step']}, epoch {state['epoch']}, batch {state['batch_index']}")
    if main_process:  # drop log lines written after the checkpoint by the run that stopped
        kept = [r for r in read_jsonl(log_path) if r["step"] <= state["step"] and not r.get("final")]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        for leftover in checkpoint_root.glob("tmp_step_*"):  # half-written or half-deleted by a killed run
            shutil.rmtree(leftover, ignore_errors=True)
    if args.report_to != "none":
        accelerator.init_trackers("logs", config={k: v for k, v in vars(args).items()
                                                  if isinstance(v, (int, float, str, bool))})

    def checkpoint(interim=False):
        """Save the current state; a failed write (a full disk) ends the run, naming the checkpoint to resume from."""
        try:
            return save_checkpoint(accelerator, model, config, checkpoint_root, {**state, "log_window": window},
                                   keep, interim)
        except Exception as error:  # whatever the writer raised: the previous checkpoint is intact
            complete = list_checkpoints(checkpoint_root)
            fail(f"could not write the checkpoint of step {state['step']} in {checkpoint_root} ({error}). The steps "
                 f"since {complete[-1] if complete else 'the start'} are lost, nothing else. Free some space, then "
                 f"continue with:\n  {resume_command(argv)}")

    def end_run(message, exit_code):
        stop.restore()
        progress.close()
        if main_process:
            print(message, file=sys.stderr if exit_code else sys.stdout, flush=True)
        accelerator.end_training()
        raise SystemExit(exit_code)

    # --- Training (sections 5.2-5.4). ---
    step, epoch, batch_index = state["step"], state["epoch"], state["batch_index"]
    try:
        sampler.set_epoch(epoch, batch_index)
    except ValueError as error:  # the checkpoint was written with other batches (--batch_tokens, processes, data)
        fail(f"cannot continue {resume_from} at batch {batch_index} of epoch {epoch}: {error}.")
    batch_stream = iter(train_loader)
    unwrapped = accelerator.unwrap_model(model)
    run_tokens, run_seconds, last_eval = 0, 0.0, {}
    progress = tqdm(total=args.max_steps, initial=step, disable=not main_process, desc="training", dynamic_ncols=True)
    stop = StopSignal()  # from here on, SIGTERM and SIGINT end the run after the step under way, checkpointed
    model.train()
    while step < args.max_steps:
        step_start = time.perf_counter()
        batches = [next(batch_stream) for _ in range(args.grad_accum)]
        counts = torch.tensor([sum(int(b["labels"].ne(-100).sum()) for b in batches),
                               sum(int(b["attention_mask"].sum()) for b in batches)], device=accelerator.device)
        target_tokens, source_tokens = accelerator.reduce(counts, reduction="sum").tolist()
        # Smoothed loss and plain cross-entropy summed over the step's tokens, and this process's vote to stop.
        sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
        for batch in batches:
            batch = {k: v.to(accelerator.device) for k, v in batch.items()}
            with accelerator.accumulate(model):
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               decoder_input_ids=batch["decoder_input_ids"]).logits
                loss_sum, nll_sum = token_loss_sums(logits, batch["labels"], args.label_smoothing)
                # The step's loss is the sum over its target tokens divided by their number. DDP averages gradients
                # over the processes and Accelerate divides by the accumulation steps: both are undone here.
                scale = accelerator.num_processes * accelerator.gradient_accumulation_steps / target_tokens
                accelerator.backward(loss_sum * scale)
                sums[0] += loss_sum.detach().double()
                sums[1] += nll_sum.double()
        if not accelerator.sync_gradients:
            raise RuntimeError("gradient accumulation is out of step with --grad_accum")
        sums[2] = stop.received is not None
        # One all-reduce gives every process the same losses and votes: all skip the same steps, stop after the same.
        sums = accelerator.reduce(sums, reduction="sum")
        loss_is_finite = bool(sums[:2].isfinite().all())
        learning_rate = scheduler.get_last_lr()[0]
        if loss_is_finite:  # else the weights and Adam's moments stay as they were
            if args.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        skipped = not loss_is_finite or accelerator.optimizer_step_was_skipped  # the latter: fp16 overflow
        seconds = time.perf_counter() - step_start

        step += 1
        batch_index += args.grad_accum
        if batch_index + args.grad_accum > len(sampler):  # epoch done: a new order of new batches
            epoch, batch_index = epoch + 1, 0
            sampler.set_epoch(epoch)
            batch_stream = iter(train_loader)
        tokens = int(source_tokens + target_tokens)
        state.update(step=step, epoch=epoch, batch_index=batch_index, tokens_seen=state["tokens_seen"] + tokens,
                     target_tokens_seen=state["target_tokens_seen"] + int(target_tokens),
                     train_seconds=state["train_seconds"] + seconds, skipped_steps=state["skipped_steps"] + skipped,
                     bad_streak=0 if loss_is_finite else state["bad_streak"] + 1,
                     good_weights_step=step - 1 if loss_is_finite else state["good_weights_step"])
        run_tokens, run_seconds = run_tokens + tokens, run_seconds + seconds
        for key, value in (("tokens", tokens), ("seconds", seconds), ("steps", 1), ("skipped", int(skipped))):
            window[key] += value
        if loss_is_finite:
            for key, value in (("loss", sums[0].item()), ("nll", sums[1].item()), ("target_tokens", target_tokens)):
                window[key] += value
        elif main_process:
            progress.write(f"step {step}: the loss is {sums[0].item()}; step skipped, weights unchanged "
                           f"({state['bad_streak']} in a row, the run stops at --max_bad_steps {args.max_bad_steps})")
        progress.update(1)

        if step % args.log_every == 0 or step == args.max_steps:
            per_token = window["target_tokens"] or math.nan  # nan: every step of the window was skipped
            record = {"step": step, "epoch": epoch, "loss": window["loss"] / per_token,
                      "nll": window["nll"] / per_token, "lr": learning_rate,
                      "tokens": state["tokens_seen"], "tokens_per_step": window["tokens"] / window["steps"],
                      "tokens_per_sec": window["tokens"] / window["seconds"], "skipped_steps": window["skipped"]}
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{learning_rate:.2e}",
                                 tok_s=f"{record['tokens_per_sec']:.0f}")
            accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=step)
            if main_process:
                append_jsonl(log_path, record)
            window = dict.fromkeys(window, 0)

        if args.eval_every and step % args.eval_every == 0:
            last_eval = validate(accelerator, unwrapped, tokenizer, valid_loader, bleu_pairs, args)
            accelerator.log({f"valid/{k}": v for k, v in last_eval.items() if isinstance(v, float)}, step=step)
            if main_process:
                append_jsonl(log_path, {"step": step, **last_eval})
                progress.write(f"step {step}: validation loss {last_eval['val_loss']:.3f}"
                               + (f", BLEU {last_eval['bleu']:.2f}" if "bleu" in last_eval else "")
                               + (f"; e.g. {last_eval['example'][:100]!r}" if "example" in last_eval else ""))

        on_grid = step % args.save_every == 0 or step == args.max_steps
        signalled = sums[2].item() > 0
        if on_grid or step == args.stop_after or signalled:
            saved = checkpoint(interim=not on_grid)
        if state["bad_streak"] >= args.max_bad_steps:
            end_run(too_many_bad_steps(state, args.max_bad_steps, checkpoint_root), 1)
        if signalled:
            received = stop.received or signal.SIGTERM  # a process the signal missed stops with the others
            end_run(f"train.py: {signal.Signals(received).name} received: stopped after step {step} of "
                    f"{args.max_steps}, checkpoint in {saved}. Continue with:\n  {resume_command(argv)}",
                    128 + received)
        if step == args.stop_after:
            stop.restore()
            progress.close()
            say(f"stopped after step {step} (--stop_after); continue with --resume")
            accelerator.end_training()
            return None
    stop.restore()  # after the last step every checkpoint is written: a signal now ends the run at once
    progress.close()

    # --- Section 6.1: the final model averages the last checkpoints. Every process computes the same average. ---
    trained_checksum = weights_checksum(unwrapped) if accelerator.distributed_type not in (
        DistributedType.FSDP, DistributedType.DEEPSPEED) else None
    averaged_paths = [path for path in list_checkpoints(checkpoint_root) if not is_interim(path)][-args.average_last:]
    say(f"averaging {len(averaged_paths)} checkpoints: {', '.join(p.name for p in averaged_paths)}")
    final_model = VaswaniForConditionalGeneration(config)
    load_weights_into(final_model, average_checkpoints(averaged_paths))
    final_model.to(accelerator.device).eval()
    final_checksum = weights_checksum(final_model)
    processes = gather_object([{"rank": accelerator.process_index, "trained": trained_checksum,
                                "averaged": final_checksum, "tokenized": not train.from_cache}])
    final_eval = validate(accelerator, final_model, tokenizer, valid_loader, bleu_pairs, args)
    accelerator.log({f"final/{k}": v for k, v in final_eval.items() if isinstance(v, float)}, step=step)

    if main_process:
        final_model.save_pretrained(output_dir)  # config, weights, generation config (beam 4, alpha 0.6), code
        tokenizer.save_pretrained(output_dir)
        append_jsonl(log_path, {"step": step, "final": True, "averaged_checkpoints": len(averaged_paths),
                                **final_eval})
        write_plots(output_dir, args, config.d_model)
        summary = {
            "preset": args.preset,
            "steps": step,
            "epochs": round(epoch + batch_index / max(len(sampler), 1), 3),
            "tokens_seen": state["tokens_seen"],
            "target_tokens_seen": state["target_tokens_seen"],
            "tokens_per_step": state["tokens_seen"] / max(step, 1),
            "tokens_per_sec": run_tokens / run_seconds if run_seconds else None,
            "train_seconds": state["train_seconds"],
            "wall_seconds": time.time() - wall_start,
            "final_val_loss": final_eval["val_loss"],
            "final_val_ppl": final_eval["val_ppl"],
            "final_val_bleu": final_eval.get("bleu"),
            "bleu_signature": final_eval.get("bleu_signature"),
            "bleu_samples": len(bleu_pairs[0]),
            "last_periodic_eval": {k: v for k, v in last_eval.items() if k != "example"},
            "averaged_checkpoints": [p.name for p in averaged_paths],
            "num_parameters": sum(p.numel() for p in final_model.parameters()),
            "train_pairs": len(train),
            "train_pairs_dropped": train.too_long,
            "train_pairs_truncated": train.truncated,
            "train_pairs_without_text": train.without_text,
            "skipped_steps": state["skipped_steps"],
            "hardware": hardware_description(accelerator),
            "world_size": accelerator.num_processes,
            "processes": processes,  # per process: checksums of its weights, and whether it tokenized the corpus
            "resumed_from": str(resume_from) if resume_from else None,
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "launched_by_accelerate": "ACCELERATE_MIXED_PRECISION" in os.environ,
            "args": vars(args),
        }
        (output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
        say(f"final model (average of {len(averaged_paths)} checkpoints) in {output_dir}: validation loss "
            f"{final_eval['val_loss']:.3f}" + (f", BLEU {final_eval['bleu']:.2f}" if "bleu" in final_eval else "")
            + f"; {summary['tokens_per_sec'] or 0:.0f} tokens/s")
        if args.push_to_hub:
            try:
                say(f"pushed to the Hub: {push_to_hub(output_dir, args.hub_model_id, private=args.hub_private_repo)}")
            except PushError as error:  # the trained model is safe on disk: say how to push it again
                fail(f"{error}\nThe model is saved in {output_dir}; push it later with: python scripts/push_to_hub.py "
                     f"--model_dir {output_dir} --repo_id {args.hub_model_id}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return final_model


if __name__ == "__main__":
    main(sys.argv[1:])
