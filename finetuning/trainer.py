"""Fine-tuning with transformers' `Seq2SeqTrainer` on the paper's terms: `FinetuningArguments` (every
Seq2SeqTrainingArguments field, with the defaults of section 5.4 and 6.1 where translation asks for them), the BLEU
`compute_metrics` every command of this package scores with, and `KeepGenerationConfig`, the callback that keeps the
model's own decoding settings through Trainer's evaluations. `vaswani-finetune` is these over a DatasetDict; a user's
own Seq2SeqTrainer takes them as they are."""

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import Seq2SeqTrainingArguments, TrainerCallback
from transformers.trainer_utils import IntervalStrategy
from transformers.training_args import OptimizerNames

from ..checks import UsageError
from ..progress import watched


def default(name, value, **metadata):
    """A Seq2SeqTrainingArguments field with this recipe's default, keeping the library's help unless replaced."""
    return field(default=value, metadata={**Seq2SeqTrainingArguments.__dataclass_fields__[name].metadata, **metadata})


@dataclass
class FinetuningArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments, every field a flag; the fields below are those whose default translation changes."""

    _argument_group_name = "training (Seq2SeqTrainingArguments)"
    output_dir: str = field(metadata={"help": "checkpoints, then the final model and tokenizer"})
    optim: OptimizerNames | str = default("optim", "adamw_torch")
    per_device_train_batch_size: int = default("per_device_train_batch_size", 32)
    per_device_eval_batch_size: int = default("per_device_eval_batch_size", 32)
    label_smoothing_factor: float = default("label_smoothing_factor", 0.1, help="epsilon_ls (paper, section 5.4)")
    # A bool|None field takes a bare flag only through nargs/const, as the library's activation_checkpointing does;
    # bf16's None, which the library does not take, is decided in __post_init__.
    bf16: bool | None = default(
        "bf16", None, help="bfloat16 mixed precision; default: when the GPU has it", nargs="?", const=True
    )
    hub_private_repo: bool | None = default("hub_private_repo", None, nargs="?", const=True)
    logging_steps: float = default("logging_steps", 50)
    disable_tqdm: bool | None = default(
        "disable_tqdm",
        None,
        help="no progress bar (the log's lines at each logging step instead); default: where the output is a log, "
        "not a terminal",
        nargs="?",
        const=True,
    )
    eval_strategy: IntervalStrategy | str = default("eval_strategy", "steps")
    eval_steps: float | None = default("eval_steps", 500)
    save_total_limit: int | None = default("save_total_limit", 3)
    predict_with_generate: bool = default("predict_with_generate", True)
    generation_num_beams: int | None = default(
        "generation_num_beams", 4, help="evaluation beam size (paper: 4)", aliases=["--num_beams"]
    )
    generation_max_length: int | None = default(
        "generation_max_length",
        None,
        help="one limit for every evaluation translation (tokens); default: the model's own (a vaswani model: each "
        "sentence's source length + 50, section 6.1), else --max_target_length",
    )
    resume_from_checkpoint: str | None = default(
        "resume_from_checkpoint",
        None,
        help="continue from a checkpoint folder; 'latest' (or the bare flag): OUTPUT_DIR's last one",
        nargs="?",
        const="latest",
        metavar="PATH|latest",
    )

    def __post_init__(self):
        # The library reads every max_steps below 1 as "train for num_train_epochs"; only its default -1 means that.
        if self.max_steps != -1 and self.max_steps < 1:
            raise UsageError(
                f"--max_steps must be a positive number of optimizer steps, or -1 to train for --num_train_epochs; "
                f"got {self.max_steps}"
            )
        if self.disable_tqdm is None:  # a log gets the logging steps' lines, not a bar's updates
            self.disable_tqdm = not watched()
        if self.bf16 is None:
            self.bf16 = not self.use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        super().__post_init__()


def bleu_metrics(tokenizer, target_lang=None):
    """`compute_metrics` for predict_with_generate: BLEU as every command of this package scores it (the metric of
    `load_metric`), its sacreBLEU signature, the paper's tokenized BLEU (with `target_lang`), and the mean translation
    length in tokens."""
    from ..evaluation.bleu import (
        load_metric,  # here: vaswani-finetune --help reads FinetuningArguments without evaluate
    )

    metric = load_metric(target_lang)

    def compute_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # The evaluation loop pads batches to a common length with -100, which is no token.
        predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        bleu = metric.compute(predictions=hypotheses, references=references)
        lengths = (predictions != tokenizer.pad_token_id).sum(axis=1)
        metrics = {
            "bleu": bleu["score"],
            "bleu_signature": bleu["signature"],
            "chrf": bleu["chrf"],
            "gen_len": float(lengths.mean()),
        }
        if "tokenized_bleu" in bleu:
            metrics["tokenized_bleu"] = bleu["tokenized_bleu"]
        return metrics

    return compute_metrics


class KeepGenerationConfig(TrainerCallback):
    """Put the model's generation config back after each evaluation.

    Seq2SeqTrainer.prediction_step fills every unset field of `model.generation_config` with the library defaults,
    max_length=20 among them, and they would be saved with every later checkpoint and with the final model. A vaswani
    model takes that filled-in max_length for no limit (its generate() keeps each sentence's own, section 6.1); a
    model of another class would stop every translation at 20 tokens.
    """

    def __init__(self, generation_config):
        self.generation_config = copy.deepcopy(generation_config)

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        if model is not None:
            model.generation_config = copy.deepcopy(self.generation_config)
