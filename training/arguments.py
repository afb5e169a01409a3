"""How to train: vaswani-train's flags, which the recipe's parts read too (any loop that runs `vaswani.training.run`
on them). It imports what `import vaswani` brings and no more (no datasets, evaluate or matplotlib), so that --help
and a mistake in the flags answer without the training extras."""

import argparse
import os
from dataclasses import dataclass, field
from typing import Literal

from ..checks import UsageError
from ..configuration.configuration_vaswani import INIT_SCHEMES, PRESETS
from .schedule import SCHEDULES


@dataclass
class TrainArguments:
    """vaswani-train's flags. The defaults are the paper's base model and its steps of 50,000 tokens, on however many
    GPUs (Table 3, sections 5.1-5.4); docs/training.md and configs/README.md give the flags for a small run on a CPU."""

    # Data (section 5.1).
    dataset_dir: str = field(metadata={"help": "DatasetDict saved by scripts/prepare_data.py"})
    tokenizer: str = field(metadata={"help": "tokenizer folder saved by scripts/train_tokenizer.py"})
    output_dir: str = field(metadata={"help": "checkpoints, logs, and at the end the averaged model"})
    source_lang: str = "en"
    target_lang: str = "es"
    max_source_length: int = field(default=256, metadata={"help": "longest source, in tokens with </s>"})
    max_target_length: int = field(default=256, metadata={"help": "longest target, in tokens with </s>"})
    long_pairs: Literal["filter", "truncate"] = field(
        default="filter", metadata={"help": "what to do with training pairs longer than the maximum lengths"}
    )
    batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": "padded source+target tokens per batch and process; default: the paper's step of 25000+25000 "
            "tokens over the processes and --gradient_accumulation_steps (50000 on one GPU, 6250 on each of 8)"
        },
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "batches accumulated into one optimizer step, to reach the paper's tokens per step"},
    )
    num_proc: int = field(
        default=min(os.cpu_count() or 1, 16),
        metadata={"help": "processes that tokenize the corpus the first time (the result is cached next to it)"},
    )
    dataloader_num_workers: int = field(
        default=0,
        metadata={
            "help": "processes that read and pad the next batches while the model trains (a GPU wants 2 or more; on a "
            "CPU they compete with training for the cores)"
        },
    )
    # Model (Table 3).
    preset: Literal[tuple(sorted(PRESETS))] | None = field(
        default=None, metadata={"help": "a size of Table 3 (PRESETS); default: base, unless --config_name is given"}
    )
    config_name: str | None = field(
        default=None, metadata={"help": "a config.json, or a folder holding one, to start from instead of a preset"}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": 'config fields set on top of the preset or --config_name, e.g. "d_model=128,encoder_ffn_dim=256,'
            "decoder_ffn_dim=256\" (Table 3's variants); the vocabulary and special ids come from the tokenizer"
        },
    )
    dropout: float | None = field(default=None, metadata={"help": "P_drop (section 5.4); default: the preset's"})
    attention_dropout: float | None = field(default=None, metadata={"help": "default: the config's (0)"})
    init_scheme: Literal[tuple(INIT_SCHEMES)] | None = field(
        default=None, metadata={"help": "how the new model's weights are drawn (INIT_SCHEMES); default: the config's"}
    )
    # Optimizer and schedule (sections 5.2, 5.3, 5.4).
    max_steps: int = field(default=100_000, metadata={"help": "optimizer steps (base: 100k, big: 300k)"})
    lr_schedule: Literal[SCHEDULES] = field(
        default="paper",
        metadata={
            "help": "paper: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); short: the same shape scaled to peak at "
            "--peak_lr, for runs of a few hundred steps"
        },
    )
    warmup_steps: int = 4000
    lr_scale: float = field(default=1.0, metadata={"help": "multiplies the paper schedule"})
    peak_lr: float = field(default=1e-3, metadata={"help": "peak of the short schedule"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "epsilon_ls (section 5.4)"})
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "clip gradients to this norm; 0: off, as in the paper"}
    )
    seed: int = 0
    max_bad_steps: int = field(
        default=10,
        metadata={"help": "stop after this many steps in a row with a non-finite loss (each is skipped: no update)"},
    )
    # Hardware.
    mixed_precision: Literal["no", "bf16", "fp16"] | None = field(
        default=None, metadata={"help": "default: what `accelerate launch` / the accelerate config says (else no)"}
    )
    use_cpu: bool = field(default=False, metadata={"help": "train on the CPU even if a GPU is present"})
    torch_compile: bool | None = field(
        default=None,
        metadata={
            "help": "train the model through torch.compile (inductor); default: on a GPU yes, on the CPU no "
            "(`accelerate launch --dynamo_backend` is not read)"
        },
    )
    ddp_timeout: int = field(
        default=1800,
        metadata={
            "help": "seconds a process waits for the others in a collective operation (as transformers' "
            "TrainingArguments.ddp_timeout); the wait while the main process tokenizes the corpus the first time "
            "is not bound by it"
        },
    )
    # Checkpoints and output (section 6.1).
    save_steps: int = field(default=1000, metadata={"help": "steps between checkpoints"})
    save_total_limit: int = field(default=5, metadata={"help": "how many recent checkpoints to keep"})
    average_last: int = field(
        default=5,
        metadata={"help": "average the last K checkpoints into the final model (paper: 5 base, 20 big); 1: none"},
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "nargs": "?",
            "const": "latest",
            "help": "continue from the latest complete checkpoint in OUTPUT_DIR (or from this folder)",
        },
    )
    resume_with_changes: bool = field(
        default=False,
        metadata={
            "help": "resume although settings that decide the steps (batches, data, random streams, learning rates) "
            "differ from the checkpoint's; the run then no longer continues exactly"
        },
    )
    push_to_hub: bool = field(default=False, metadata={"help": "at the end, upload the final model (one commit)"})
    hub_model_id: str | None = field(default=None, metadata={"help": "NAMESPACE/NAME of the Hub repo"})
    hub_private_repo: bool = field(default=False, metadata={"help": "create the Hub repo as private"})
    # Validation and logs.
    eval_steps: int = field(default=1000, metadata={"help": "steps between validations; 0: only at the end"})
    eval_bleu_samples: int = field(default=500, metadata={"help": "BLEU on the first N validation pairs; 0: none"})
    generation_num_beams: int = field(default=1, metadata={"help": "1: greedy decoding; 4: the paper's beam"})
    eval_length_penalty: float = 0.6
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "sentences per generate() call"})
    logging_steps: int = field(default=50, metadata={"help": "steps between training-loss log lines"})
    report_to: Literal["tensorboard", "none"] = "tensorboard"
    # For the tests of --resume_from_checkpoint: checkpoint and stop after this step, as if killed there.
    stop_after: int | None = field(default=None, metadata={"help": argparse.SUPPRESS})

    def __post_init__(self):
        if self.preset is not None and self.config_name is not None:
            raise UsageError("give --preset or --config_name, not both (--config_overrides changes either)")
        if self.config_name is None:
            self.preset = self.preset or "base"
        if self.push_to_hub and not self.hub_model_id:
            raise UsageError("--push_to_hub needs --hub_model_id NAMESPACE/NAME")
        for name in (
            "batch_tokens",  # None: the paper's step (paper_batch_tokens)
            "gradient_accumulation_steps",
            "max_steps",
            "warmup_steps",
            "save_steps",
            "save_total_limit",
            "average_last",
            "logging_steps",
            "generation_num_beams",
            "per_device_eval_batch_size",
            "max_source_length",
            "max_target_length",
            "max_bad_steps",
            "num_proc",
            "ddp_timeout",
        ):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1")
        if not 0.0 <= self.label_smoothing_factor < 1.0:
            raise UsageError("--label_smoothing_factor must be in [0, 1)")
        if self.dataloader_num_workers < 0:
            raise UsageError("--dataloader_num_workers must be at least 0")
