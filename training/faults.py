"""Faults a long run must survive (docs/reliability.md): preemption signals, a loss that stops being finite, and a
disk too small for the checkpoints. Each ends the run with its last checkpoint intact and says how to continue."""

import os
import shlex
import shutil
import signal
import sys

import torch

from ..checks import UsageError
from .checkpoints import checkpoint_step, list_checkpoints


class StopSignal:
    """SIGTERM (cluster preemption, `kill`) and SIGINT (Ctrl-C) ask the run to stop after the optimizer step under way.

    The handler only records the signal; the loop makes every process vote at the end of each step, so that all stop
    after the same step, checkpoint and exit with 128 + the signal number (143 for SIGTERM, 130 for SIGINT), as a
    shell reports a process ended by the signal. A second Ctrl-C stops at once, losing the steps since the last
    checkpoint but never a checkpoint. A context manager: the previous handlers come back on leaving it.
    """

    def __init__(self):
        self.received = None
        self.previous = {}

    def __enter__(self):
        self.previous = {sig: signal.signal(sig, self.record) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc_info):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def record(self, signum, frame):
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = self.received or signum


def resume_command(argv):
    """The command that continues this run: the same arguments, with --resume_from_checkpoint (the latest checkpoint)
    once."""
    kept, i = [], 0
    while i < len(argv):
        if argv[i] == "--resume_from_checkpoint":  # with or without a checkpoint folder after it
            i += 2 if i + 1 < len(argv) and not argv[i + 1].startswith("-") else 1
            continue
        if not argv[i].startswith("--resume_from_checkpoint="):
            kept.append(argv[i])
        i += 1
    if sys.argv[0].endswith(".py") and os.path.isfile(sys.argv[0]):  # python scripts/train.py, accelerate launch
        program = [os.path.relpath(sys.argv[0])]
        python = [sys.executable]
    else:  # the console entry point (or a program given with python -c)
        program, python = ["vaswani-train"], []
    if "ACCELERATE_MIXED_PRECISION" in os.environ:  # started by `accelerate launch`
        return (
            f"accelerate launch <the same launch options> {shlex.join([*program, *kept, '--resume_from_checkpoint'])}"
        )
    return shlex.join([*python, *program, *kept, "--resume_from_checkpoint"])


def non_finite_loss_message(state, max_bad_steps, checkpoint_root):
    """Why a run whose loss stayed non-finite stopped, naming the last checkpoint with good weights: the newest one
    not after the weights that last gave a finite loss (the update that followed was never scored)."""
    good = [path for path in list_checkpoints(checkpoint_root) if checkpoint_step(path) <= state.good_weights_step]
    return (
        f"the loss was not finite for {state.bad_streak} steps in a row; stopped at step {state.step} "
        f"(--max_bad_steps {max_bad_steps}). The weights of step {state.good_weights_step} are the last known to "
        "give a finite loss: "
        + (
            f"the last good checkpoint is {good[-1]}. Continue from it with --resume_from_checkpoint {good[-1]} "
            if good
            else "no checkpoint holds them. Start again "
        )
        + "after lowering the learning rate (--peak_lr / --lr_scale) or with --max_grad_norm."
    )


def check_free_space(output_dir, model_class, config, keep, existing):
    """Fail now, not at the first checkpoint hours from now, if the disk cannot hold the checkpoints of the run.

    One checkpoint holds the float32 weights (4 bytes a parameter) and Adam's two moments (8 bytes), plus 10% and a
    MiB for the schedule, random states and format overhead. Up to `keep` + 1 are on disk at once (the newest is
    complete before the oldest goes), `existing` of which are there already (at least one more is always written),
    and the final model needs 4 bytes a parameter more.
    """
    with torch.device("meta"):
        parameters = model_class(config).num_parameters()
    checkpoint_bytes = int(parameters * (4 + 8) * 1.1) + 2**20
    needed = max(keep + 1 - existing, 1) * checkpoint_bytes + parameters * 4
    free = shutil.disk_usage(output_dir).free
    if free < needed:
        raise UsageError(
            f"--output_dir {output_dir} has {free / 1e6:,.0f} MB free, but the run needs about "
            f"{needed / 1e6:,.0f} MB: up to {keep + 1} checkpoints of {checkpoint_bytes / 1e6:,.0f} MB "
            f"({parameters:,} parameters x 12 bytes of weights and Adam moments) and the final model. "
            "Free some space, lower --save_total_limit / --average_last, or choose another --output_dir."
        )
    return needed
