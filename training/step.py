"""One optimizer step of the recipe (sections 5.2-5.4): the label-smoothed loss summed over the step's target tokens,
accumulated over its batches, one Adam update. The training command, the benchmarks and the learning-curve study
all take this step, so that what they measure is what the recipe does.
"""

from dataclasses import dataclass

import torch
from accelerate.utils import DistributedType

from ..modeling import label_smoothed_cross_entropy


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


def count_tokens(accelerator, batches) -> tuple[int, int]:
    """The labelled target tokens and the source tokens of a step's batches, over every process."""
    counts = torch.tensor(
        [
            sum(int(batch["labels"].ne(-100).sum()) for batch in batches),
            sum(int(batch["attention_mask"].sum()) for batch in batches),
        ],
        device=accelerator.device,
    )
    target_tokens, source_tokens = accelerator.reduce(counts, reduction="sum").tolist()
    return int(target_tokens), int(source_tokens)


def train_step(
    accelerator, model, optimizer, scheduler, batches, label_smoothing, max_grad_norm=0.0, stop_vote=False
) -> StepResult:
    """One optimizer step over `batches` (this process's share; one per accumulated batch) of a model, optimizer and
    schedule prepared by `accelerator` with `gradient_accumulation_steps=len(batches)`.

    The step's loss is the sum over all its target tokens divided by their number, whatever the processes and
    accumulation (section 5.4's label smoothing, `label_smoothing`). A non-finite loss on any process skips the update
    on every process: the weights and Adam's moments stay as they were. `max_grad_norm` > 0 clips the gradients (the
    paper does not). `stop_vote`: this process asks to stop after this step; every process learns the count.
    """
    target_tokens, source_tokens = count_tokens(accelerator, batches)
    # The smoothed loss and plain cross-entropy summed over the step's tokens, and this process's stop vote.
    sums = torch.zeros(3, dtype=torch.float64, device=accelerator.device)
    # DDP averages the gradients over the processes and Accelerate divides by the accumulated batches: undone here.
    scale = accelerator.num_processes * accelerator.gradient_accumulation_steps / target_tokens
    for index, batch in enumerate(batches):
        batch = {key: value.to(accelerator.device) for key, value in batch.items()}
        labels = batch.pop("labels")  # the loss is ours: summed over the step's tokens, not averaged
        with accelerator.accumulate(model):
            logits = model(**batch).logits
            smoothed, plain = label_smoothed_cross_entropy(logits, labels, label_smoothing)
            loss = smoothed.sum() * scale
            sums[0] += smoothed.sum().detach().double()
            sums[1] += plain.sum().double()
            if index == len(batches) - 1:
                sums[2] = stop_vote
                # One all-reduce gives every process the same losses and votes: all skip and stop after the same
                # steps. Before the last backward pass, since DeepSpeed's engine updates inside it: a non-finite loss
                # anywhere makes every process's gradients NaN, which the engine skips.
                sums = accelerator.reduce(sums, reduction="sum")
                finite = bool(sums[:2].isfinite().all())
                if not finite and accelerator.distributed_type == DistributedType.DEEPSPEED:
                    loss = loss * float("nan")
            accelerator.backward(loss)
    if not accelerator.sync_gradients:
        raise RuntimeError(
            f"gradient accumulation is out of step: {len(batches)} batches, but the accelerator accumulates "
            f"{accelerator.gradient_accumulation_steps}"
        )
    learning_rate = scheduler.get_last_lr()[0] if scheduler is not None else optimizer.param_groups[0]["lr"]
    if finite:
        if max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    loss_sum, nll_sum, stop_votes = sums.tolist()
    return StepResult(
        loss=loss_sum,
        nll=nll_sum,
        target_tokens=target_tokens,
        source_tokens=source_tokens,
        learning_rate=learning_rate,
        finite=finite,
        skipped=not finite or accelerator.optimizer_step_was_skipped,  # the latter: an fp16 overflow
        stop_votes=int(stop_votes),
    )
