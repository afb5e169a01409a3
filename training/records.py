"""What a run leaves for a person to read: the step log (train_log.jsonl, one JSON object per line, easy to plot),
its pictures (training_curves.png, lr_schedule.png) and a description of the hardware."""

import json
import os
import platform
from pathlib import Path

from .schedule import inverse_sqrt_lr


# numpy, torch and matplotlib are imported by the functions that use them: the commands import this module before
# they parse their arguments.


def read_jsonl(path):
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_jsonl(path, record):
    with open(path, "a") as file:
        file.write(json.dumps(record) + "\n")


def write_plots(output_dir, schedule, max_steps, warmup_steps, peak_lr, bleu_samples):
    """training_curves.png (losses and validation BLEU, the averaged model as a star) and lr_schedule.png (the
    schedule's curve with the logged learning rates), from train_log.jsonl."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
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
        loss_axis.plot(
            final["step"], final["val_loss"], "*", markersize=12, color="tab:red", label="averaged model, validation"
        )
        loss_axis.legend()
        if "bleu" in final:
            bleu_axis.plot(final["step"], final["bleu"], "*", markersize=12, color="tab:red", label="averaged model")
            bleu_axis.legend()
    bleu_axis.set(xlabel="step", ylabel="BLEU", title=f"Validation BLEU (first {bleu_samples} pairs)")
    bleu_axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output_dir / "training_curves.png", dpi=120)
    plt.close(fig)

    steps = np.unique(np.linspace(1, max_steps, min(max_steps, 2000)).astype(int))
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, [inverse_sqrt_lr(s, warmup_steps, peak_lr) for s in steps], label=f"{schedule} schedule")
    axis.plot([r["step"] for r in train], [r["lr"] for r in train], ".", markersize=3, label="logged")
    axis.axvline(warmup_steps, color="gray", linestyle=":", label=f"warmup_steps = {warmup_steps}")
    axis.set(xlabel="step", ylabel="learning rate", title="Learning rate (section 5.3)")
    axis.legend()
    axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output_dir / "lr_schedule.png", dpi=120)
    plt.close(fig)


def hardware_description(accelerator):
    import torch

    device = accelerator.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {
        "device": str(device),
        "device_name": name,
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "mixed_precision": accelerator.mixed_precision,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
