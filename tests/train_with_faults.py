"""vaswani-train with a fault or a stand-in, injected through its callbacks (`main(argv, callbacks=...)`), for the
faults that cannot be caused from outside the process: a full disk, a NaN at a chosen step, a kill halfway through a
checkpoint.

    python tests/train_with_faults.py FAULT [vaswani-train's arguments]
    accelerate launch ... tests/train_with_faults.py FAULT [vaswani-train's arguments]

It runs as the console script `vaswani-train` does (that name in its messages and resume commands). FAULTS lists the
faults; the tests that use each say what it stands for.
"""

import errno
import math
import os
import resource
import signal
import sys
import time
from pathlib import Path

import torch

from vaswani.scripts import train
from vaswani.training.run import TrainingCallback


class CheckpointFault(TrainingCallback):
    """`fault(checkpoint_folder)` runs as accelerate starts writing the checkpoint of step `step`, into its temporary
    folder (an accelerate save-state hook)."""

    def __init__(self, step, fault):
        self.folder_name, self.fault = f"tmp_step_{step:07d}", fault

    def on_train_begin(self, accelerator, model, optimizer):
        accelerator.register_save_state_pre_hook(self.before_save)

    def before_save(self, models, weights, output_dir):
        if Path(output_dir).name == self.folder_name:
            self.fault(Path(output_dir))


def disk_full(folder):
    raise OSError(errno.ENOSPC, "No space left on device", str(folder / "optimizer.bin"))


def files_limited(folder):
    """From here on the kernel refuses to grow a file past 64 KiB (EFBIG): not a simulated error."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**16, resource.RLIM_INFINITY))


def half_written_then_wait(folder):
    """The checkpoint's weights half on disk, `halfway` next to the output folder, then wait to be killed."""
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    folder.parent.parent.joinpath("halfway").touch()
    time.sleep(600)


class KilledAfterStep(TrainingCallback):
    """Rank `rank` dies by SIGKILL after step `step`, in the launcher's first life of the job only."""

    def __init__(self, step, rank):
        self.step, self.rank = step, rank

    def on_step_end(self, state, result):
        first_life = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if state.step == self.step and first_life and os.environ.get("RANK", "0") == str(self.rank):
            os.kill(os.getpid(), signal.SIGKILL)


class NonFiniteLogits(TrainingCallback):
    """The model's training forward passes `passes` (counted from 1) give NaN logits (a forward hook)."""

    def __init__(self, passes):
        self.passes, self.count = passes, 0

    def on_train_begin(self, accelerator, model, optimizer):
        model.register_forward_hook(self.poison)

    def poison(self, module, inputs, output):
        if module.training:
            self.count += 1
            if self.passes(self.count):
                output.logits = output.logits * math.nan
        return output


class FirstGradients(TrainingCallback):
    """Rank 0 saves the first optimizer step's gradients (after DDP's all-reduce) to the file $GRADIENTS."""

    def on_train_begin(self, accelerator, model, optimizer):
        optimizer.register_step_pre_hook(self.save)

    def save(self, optimizer, args, kwargs):
        if not optimizer.state and os.environ.get("RANK", "0") == "0":
            gradients = [p.grad.clone() for group in optimizer.param_groups for p in group["params"]]
            torch.save(gradients, os.environ["GRADIENTS"])


def fsdp_on_cpu():
    """accelerate sets FSDP up on GPU-like devices only: its state takes the gloo processes of this CPU for GPUs.
    PartialState's `_prepare_backend` is private: no public setting makes accelerate shard on a CPU."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState._prepare_backend = lambda self, *args, **kwargs: ("gloo", DistributedType.MULTI_GPU)
    PartialState.set_device = lambda self: setattr(self, "device", torch.device("cpu"))
    return []


FAULTS = {
    "full-disk-at-step-12": lambda: [CheckpointFault(12, disk_full)],
    "files-limited-at-step-12": lambda: [CheckpointFault(12, files_limited)],
    "killable-at-step-24": lambda: [CheckpointFault(24, half_written_then_wait)],
    "rank-1-killed-after-step-6": lambda: [KilledAfterStep(6, rank=1)],
    "nan-at-steps-3-4-and-from-9": lambda: [NonFiniteLogits(lambda count: count in (3, 4) or count >= 9)],
    "first-gradients": lambda: [FirstGradients()],
    "fsdp-on-cpu": fsdp_on_cpu,
}


if __name__ == "__main__":
    fault, *arguments = sys.argv[1:]
    sys.argv = ["vaswani-train", *arguments]
    train.main(callbacks=FAULTS[fault]())
