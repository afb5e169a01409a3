"""What a run shows while it trains and leaves for a person to read: a line of figures at each logging step, under a
progress bar where a person watches a terminal (in a log, the lines alone: `vaswani.progress`), the step log (train_log.jsonl, one JSON object
per line, easy to plot; also to TensorBoard), its pictures (training_curves.png, lr_schedule.png), and
training_summary.json (what the run did, measured, on which hardware).

    report = TrainingReport(accelerator, output_dir, max_steps=1000, logging_steps=50, start=state)
    ... each step: report.step(state, result, seconds); after a validation: report.validation(state, result)
    report.end(state, final_eval, averaged, plot_schedule=..., summary={...})
"""

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from accelerate.utils import DistributedType, gather_object

from ..progress import progress_bar, watched
from .checkpoints import weights_checksum
from .distributed import describe
from .schedule import inverse_sqrt_lr


# matplotlib is imported by the function that draws: a run that ends early never pays for it.


class TrainingReport:
    """The progress bar and its lines, train_log.jsonl and the tracker (`accelerator.log`: TensorBoard) of a run, written by the
    main process; and what this command did (tokens, seconds), as against the whole run it may have resumed.

    Log lines after the step the run `start`s from go: a resumed run writes them again."""

    def __init__(self, accelerator, output_dir, *, max_steps, logging_steps, start, max_bad_steps=None):
        self.accelerator, self.output_dir = accelerator, Path(output_dir)
        self.log_path = self.output_dir / "train_log.jsonl"
        self.max_steps, self.logging_steps, self.max_bad_steps = max_steps, logging_steps, max_bad_steps
        self.wall_start, self.tokens, self.seconds, self.last_eval = time.time(), 0, 0.0, {}
        if accelerator.is_main_process:
            kept = [r for r in read_jsonl(self.log_path) if r["step"] <= start.step and not r.get("final")]
            self.log_path.write_text("".join(json.dumps(record) + "\n" for record in kept))
        # In a log, the lines of the logging steps are the progress: a bar would redraw after each of them.
        self.progress = progress_bar(
            total=max_steps,
            initial=start.step,
            disable=not (accelerator.is_main_process and watched()),
            desc="training",
        )

    def step(self, state, result, seconds):
        """After `state.add_step(result, seconds)`: the bar, a word on a skipped step, and every `logging_steps` (and
        at the last step) the log record of the steps since the last one, and its line under the bar."""
        self.tokens, self.seconds = self.tokens + result.tokens, self.seconds + seconds
        self.progress.update(1)
        if not result.finite and self.accelerator.is_main_process:
            self.progress.write(
                f"step {state.step}: the loss is {result.loss}; step skipped, weights unchanged "
                f"({state.bad_streak} in a row, the run stops at --max_bad_steps {self.max_bad_steps})"
            )
        if state.step % self.logging_steps and state.step != self.max_steps:
            return
        record = state.take_log_record(result.learning_rate)
        self.accelerator.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=state.step)
        if self.accelerator.is_main_process:
            append_jsonl(self.log_path, record)
            self.progress.write(
                f"step {state.step}/{self.max_steps}: loss {record['loss']:.3f}, lr {result.learning_rate:.2e}, "
                f"{record['tokens_per_sec']:,.0f} tokens/s"
            )

    def validation(self, state, result):
        """A validation's figures (`vaswani.training.validate`), logged and shown."""
        self.last_eval = result
        self.accelerator.log({f"valid/{k}": v for k, v in result.items() if isinstance(v, float)}, step=state.step)
        if self.accelerator.is_main_process:
            append_jsonl(self.log_path, {"step": state.step, **result})
            self.progress.write(
                f"step {state.step}: validation loss {result['val_loss']:.3f}"
                + (f", BLEU {result['bleu']:.2f}" if "bleu" in result else "")
                + (f"; e.g. {result['example'][:100]!r}" if "example" in result else "")
            )

    def close(self):
        self.progress.close()

    def end(self, state, final_eval, averaged, *, plot_schedule, summary):
        """The final model's validation (`final_eval`) logged, the plots drawn (`plot_schedule`: write_plots' schedule
        arguments) and training_summary.json written: the run's measured figures and `summary` (what the caller
        knows: data, model, processes, arguments)."""
        self.accelerator.log({f"final/{k}": v for k, v in final_eval.items() if isinstance(v, float)}, step=state.step)
        if not self.accelerator.is_main_process:
            return
        append_jsonl(
            self.log_path, {"step": state.step, "final": True, "averaged_checkpoints": len(averaged), **final_eval}
        )
        write_plots(self.output_dir, **plot_schedule)
        tokens_per_sec = self.tokens / self.seconds if self.seconds else None
        summary = {
            "steps": state.step,
            "tokens_seen": state.tokens_seen,
            "target_tokens_seen": state.target_tokens_seen,
            "tokens_per_step": state.tokens_seen / max(state.step, 1),
            "tokens_per_sec": tokens_per_sec,
            "train_seconds": state.train_seconds,
            "wall_seconds": time.time() - self.wall_start,
            "final_val_loss": final_eval["val_loss"],
            "final_val_ppl": final_eval["val_ppl"],
            "final_val_bleu": final_eval.get("bleu"),
            "bleu_signature": final_eval.get("bleu_signature"),
            "last_periodic_eval": {k: v for k, v in self.last_eval.items() if k != "example"},
            "averaged_checkpoints": [path.name for path in averaged],
            "skipped_steps": state.skipped_steps,
            "strategy": describe(self.accelerator),
            "hardware": hardware_description(self.accelerator),
            "world_size": self.accelerator.num_processes,
            **summary,
            "command": shlex.join([sys.executable, *sys.argv]),
            "launched_by_accelerate": "ACCELERATE_MIXED_PRECISION" in os.environ,
        }
        (self.output_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
        print(
            f"final model (average of {len(averaged)} checkpoints) in {self.output_dir}: validation loss "
            f"{final_eval['val_loss']:.3f}"
            + (f", BLEU {final_eval['bleu']:.2f}" if "bleu" in final_eval else "")
            + f"; {tokens_per_sec or 0:.0f} tokens/s"
        )


def process_records(accelerator, trained_model, final_model, tokenized):
    """Per process, for the summary: checksums of its trained and averaged weights (the same on every process of a
    data-parallel run; sharded weights have no whole copy to sum), and whether it tokenized the corpus."""
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    return gather_object(
        [
            {
                "rank": accelerator.process_index,
                "trained": None if sharded else weights_checksum(trained_model),
                "averaged": weights_checksum(final_model),
                "tokenized": tokenized,
            }
        ]
    )


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
    """The devices a run trained on. On the CPU its model and the kernels torch runs on it (AVX512, AVX2, ...) are
    recorded, because float32 sums round by them: the same run gives other figures in the third decimal elsewhere."""
    import torch

    device = accelerator.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {
        "device": str(device),
        "device_name": name,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "mixed_precision": accelerator.mixed_precision,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }


def cpu_model() -> str:
    """The CPU's model name, as Linux reports it; elsewhere what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return names[0] if names else platform.processor() or platform.machine()
