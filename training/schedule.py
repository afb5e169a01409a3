"""Section 5.3, the learning rate: linear warmup, then decay with the inverse square root of the step.

Equation 3 of the paper, lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), is a peak learning rate,
(d_model * warmup_steps)^-0.5, times a shape that rises linearly to 1 at `warmup_steps` and then falls as
sqrt(warmup_steps / step). The "paper" schedule uses the paper's peak (7e-4 for the base model with 4000 warmup
steps); the "short" schedule keeps the shape and sets the peak itself, for runs whose warmup is a few hundred steps,
where the paper's formula would peak far higher (5e-3 at d_model=256 with 150 warmup steps) and stall a small model.

`transformers.get_inverse_sqrt_schedule` has the same shape counted from step 0 (its first step trains at learning
rate 0), one step behind the paper's step_num, which counts from 1; hence this schedule of our own.
"""

SCHEDULES = ("paper", "short")


def paper_peak_lr(d_model, warmup_steps, lr_scale=1.0):
    """The peak of equation 3, reached at step `warmup_steps`, times `lr_scale`."""
    return lr_scale * (d_model * warmup_steps) ** -0.5


def inverse_sqrt_lr(step, warmup_steps, peak_lr):
    """The learning rate of optimizer step `step`, counted from 1 as the paper's step_num."""
    step = max(step, 1)
    return peak_lr * min(step / warmup_steps, (warmup_steps / step) ** 0.5)


def peak_lr_of(schedule, d_model, warmup_steps, lr_scale=1.0, peak_lr=1e-3):
    """The peak learning rate of a named schedule: the paper's, or the one a short run sets."""
    if schedule == "paper":
        return paper_peak_lr(d_model, warmup_steps, lr_scale)
    if schedule == "short":
        return peak_lr
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose one of {SCHEDULES}")


def inverse_sqrt_schedule(optimizer, warmup_steps, peak_lr):
    """A `LambdaLR` over an optimizer built with lr=1.0, stepped once per optimizer step: its scheduler step k
    (from 0) is the paper's step_num k + 1. Over accelerate's `DummyOptim` (DeepSpeed builds the optimizer:
    `vaswani.training.step.recipe_adam`), accelerate's `DummyScheduler`, with which DeepSpeed builds the same schedule
    over its optimizer and steps it after each update."""
    # Imported here, so that the commands list SCHEDULES without torch or accelerate.
    from accelerate.utils import is_deepspeed_available
    from torch.optim.lr_scheduler import LambdaLR

    if is_deepspeed_available():  # accelerate.utils has DummyOptim only then (the `deepspeed` extra)
        from accelerate.utils import DummyOptim, DummyScheduler

        if isinstance(optimizer, DummyOptim):
            return DummyScheduler(
                optimizer, lr_scheduler_callable=lambda built: inverse_sqrt_schedule(built, warmup_steps, peak_lr)
            )
    return LambdaLR(optimizer, lambda scheduler_step: inverse_sqrt_lr(scheduler_step + 1, warmup_steps, peak_lr))
