"""One optimizer step of the recipe (sections 5.2-5.4): the label-smoothed loss summed over the step's target tokens,
accumulated over its batches, one Adam update. The training command, the benchmarks and the learning-curve study
all take this step, so that what they measure is what the recipe does.
"""

import math
from dataclasses import dataclass

import torch
from accelerate.utils import DistributedType

from ..modeling import label_smoothed_cross_entropy
from .padding import batch_to_device


@dataclass
class StepResult:
    """What one optimizer step did, summed over every process.

    `loss` and `nll` are the label-smoothed loss and the plain cross-entropy summed over the step's `target_tokens`;
    `finite` says whether both were finite (else no update was made), `skipped` whether the update was left out
    (a non-finite loss, or an fp16 overflow); `stop_votes` counts the processes asked to stop (`stop_vote`).
    """

    loss: float
    nll: float
    target_tokens: int
    source_tokens: int
    learning_rate: float
    finite: bool
    skipped: bool
    stop_votes: int

    @property
    def tokens(self) -> int:
        return self.source_tokens + self.target_tokens


def count_tokens(accelerator, batches) -> torch.Tensor:
    """The labelled target tokens and the source tokens of a step's batches, over every process, on the device: counted
    where the batches are (on the host, as they come from the loader), summed over the processes without a host read."""
    counts = torch.stack(
        [
            sum(batch["labels"].ne(-100).sum() for batch in batches),
            sum(batch["attention_mask"].sum() for batch in batches),
        ]
    )
    return accelerator.reduce(counts.to(accelerator.device, torch.float64), reduction="sum")


def recipe_adam(accelerator, parameters, lr=1.0, betas=(0.9, 0.98), eps=1e-9):
    """Section 5.3's Adam (beta1 0.9, beta2 0.98, epsilon 1e-9) over `parameters`, for `accelerator.prepare`: fused
    into one kernel per update on CUDA, as NVIDIA's and fairseq's GPU recipes run it, torch's default elsewhere. `lr`
    1.0 is for a schedule that sets the learning rate (`inverse_sqrt_schedule`).

    Under a DeepSpeed config with an optimizer block (configs/deepspeed_zero2.json), DeepSpeed builds the optimizer
    itself (its FusedAdam on GPUs, its CPU kernel on the CPU): this gives it `betas` and `eps` and returns accelerate's
    `DummyOptim`, which hands it the parameters and `lr`.
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and "optimizer" in plugin.deepspeed_config:
        from accelerate.utils import DummyOptim

        plugin.deepspeed_config["optimizer"]["params"].update(betas=list(betas), eps=eps)
        return DummyOptim(parameters, lr=lr, weight_decay=0.0)
    fused = accelerator.device.type == "cuda"
    return torch.optim.Adam(parameters, lr=lr, betas=betas, eps=eps, fused=fused)


def train_step(
    accelerator, model, optimizer, scheduler, batches, label_smoothing, max_grad_norm=0.0, stop_vote=False
) -> StepResult:
    """One optimizer step over `batches` (this process's share; one per accumulated batch) of a model, optimizer and
    schedule prepared by `accelerator` with `gradient_accumulation_steps=len(batches)`.

    The step's loss is the sum over all its target tokens divided by their number, whatever the processes and
    accumulation (section 5.4's label smoothing, `label_smoothing`). A non-finite loss on any process skips the update
    on every process: the weights and Adam's moments stay as they were. `max_grad_norm` > 0 clips the gradients (the
    paper does not). `stop_vote`: this process asks to stop after this step; every process learns the count.

    Batches on the host are checked and copied to the device without blocking (`batch_to_device`). On a GPU the step
    reads one tensor back, once, after its last backward pass: the host never waits for the device in between. Under
    mixed precision the step leaves the prepared model without accelerate's float32 copy of its outputs (and its
    autocast): elsewhere, run it under `accelerator.autocast()`, as `validate` does.
    """
    # This step's learning rate: read before the backward passes, since DeepSpeed steps its schedule inside the last.
    learning_rate = scheduler.get_last_lr()[0] if scheduler is not None else optimizer.param_groups[0]["lr"]
    counts = count_tokens(accelerator, batches)  # target and source tokens, every process's
    # DDP averages the gradients over the processes and Accelerate divides by the accumulated batches: undone here.
    scale = accelerator.num_processes * accelerator.gradient_accumulation_steps / counts[0]
    # The smoothed loss and plain cross-entropy summed over the step's tokens, and this process's stop vote.
    sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    vocab_size = None  # needed to check batches bound for a device; on the CPU the model checks them
    if accelerator.native_amp or accelerator.device.type != "cpu":  # an unwrap costs milliseconds: only if needed
        # Under mixed precision accelerate wraps the prepared forward pass in autocast and a float32 copy of every
        # output; the loss reads half-precision logits as they are, summing in float32 chunk by chunk, so the copy
        # goes and the step autocasts the forward pass itself.
        unwrapped = accelerator.unwrap_model(model, keep_fp32_wrapper=not accelerator.native_amp)
        vocab_size = unwrapped.config.vocab_size
    for index, batch in enumerate(batches):
        batch = batch_to_device(batch, accelerator.device, vocab_size)
        labels = batch.pop("labels")  # the loss is ours: summed over the step's tokens, not averaged
        with accelerator.accumulate(model):
            with accelerator.autocast():
                logits = model(**batch).logits
            smoothed, plain = label_smoothed_cross_entropy(logits, labels, label_smoothing)
            loss = smoothed.sum() * scale.to(smoothed.dtype)
            sums[0] += smoothed.sum().detach().double()
            sums[1] += plain.sum().double()
            if index == len(batches) - 1:
                sums[2] = stop_vote
                # One all-reduce gives every process the same losses and votes: all skip and stop after the same
                # steps. Before the last backward pass, since DeepSpeed's engine updates inside it: a non-finite loss
                # anywhere makes every process's gradients NaN, which the engine skips. Decided on the device.
                sums = accelerator.reduce(sums, reduction="sum")
                if accelerator.distributed_type == DistributedType.DEEPSPEED:
                    loss = torch.where(sums[:2].isfinite().all(), loss, float("nan"))
            accelerator.backward(loss)
    if not accelerator.sync_gradients:
        raise RuntimeError(
            f"gradient accumulation is out of step: {len(batches)} batches, but the accelerator accumulates "
            f"{accelerator.gradient_accumulation_steps}"
        )
    # The step's one read from the device, after its last backward pass.
    loss_sum, nll_sum, stop_votes, target_tokens, source_tokens = torch.cat((sums, counts)).tolist()
    finite = math.isfinite(loss_sum) and math.isfinite(nll_sum)
    if finite:
        if max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(
        loss=loss_sum,
        nll=nll_sum,
        target_tokens=int(target_tokens),
        source_tokens=int(source_tokens),
        learning_rate=learning_rate,
        finite=finite,
        skipped=not finite or accelerator.optimizer_step_was_skipped,  # the latter: an fp16 overflow
        stop_votes=int(stop_votes),
    )
