"""Fine-tune a trained Transformer on a new sentence-pair set with the `transformers` Seq2SeqTrainer.

Every Seq2SeqTrainingArguments flag is accepted too (--learning_rate, --max_steps, --num_train_epochs, --warmup_steps,
--fp16, --push_to_hub, ...: --help lists them after this command's own), with these defaults where the paper or translation
asks for them: label smoothing 0.1, evaluation every 500 steps by beam search (4 beams, --num_beams; a vaswani
model's own decoding: the GNMT length penalty, each sentence's own limit of its source length + 50, as
vaswani-evaluate decodes) scored with the package's BLEU metric (sacreBLEU, and the paper's tokenized BLEU), batches of
32 pairs, at most 3 checkpoints kept, bfloat16 when the GPU supports it
(vaswani.finetuning.trainer.FinetuningArguments). --output_dir is required.

The data is a DatasetDict of {"translation": {SOURCE_LANG: str, TARGET_LANG: str}} rows, saved by
scripts/prepare_data.py (--dataset_dir) or loaded with datasets.load_dataset (--dataset); without the evaluation split,
a part of the training split is held out for it. OUTPUT_DIR ends with the model, its tokenizer, eval_results.json and
trainer_state.json.

With --lora_r, only low-rank adapters of the attention projections train (peft's LoRA, the `lora` extra): OUTPUT_DIR
ends with the adapter (adapter_config.json, adapter_model.safetensors), which PeftModel.from_pretrained puts on the
model it came from; --merge also writes the model with the adapter merged in, a plain model, to OUTPUT_DIR/merged.

Usage (or python scripts/finetune.py):
  vaswani-finetune --model runs/base --dataset_dir data/new --output_dir runs/finetuned
  vaswani-finetune ... --lora_r 8 --merge                  # LoRA: the adapter, and the merged model
  vaswani-finetune ... --per_device_train_batch_size 16 --gradient_accumulation_steps 4 --max_steps 2000
  vaswani-finetune ... --resume_from_checkpoint            # continue from OUTPUT_DIR's last checkpoint
  vaswani-finetune ... --push_to_hub --hub_model_id me/vaswani-en-es-finetuned
"""

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vaswani.checks import (
    UsageError,
    check_dataset_exists,
    check_extra,
    check_model_folder,
    check_tokenizer_folder,
    check_tokenizer_matches_config,
    check_writable_dir,
    seq2seq_model_types,
)
from vaswani.cli import command, parse_arguments


# The attention's input and output projections (section 3.2's W^Q, W^K, W^V, W^O) in every encoder and decoder layer.
# peft knows the projections of the architectures it lists by model type, and offers a model no way to name its own.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "out_proj")


@dataclass
class ModelArguments:
    _argument_group_name = "model"
    model: str = field(metadata={"help": "folder or Hub repo of the model to fine-tune"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer folder or repo; default: the model's"})
    trust_remote_code: bool = field(default=False, metadata={"help": "run the modelling code stored with the model"})


@dataclass
class DataArguments:
    _argument_group_name = "data"
    dataset_dir: str | None = field(default=None, metadata={"help": "DatasetDict saved by scripts/prepare_data.py"})
    dataset: str | None = field(default=None, metadata={"help": "name of a dataset for datasets.load_dataset"})
    dataset_config: str | None = field(default=None, metadata={"help": "configuration name for --dataset"})
    source_lang: str = field(default="en", metadata={"help": "key of the source side in the translation column"})
    target_lang: str = field(default="es", metadata={"help": "key of the target side in the translation column"})
    train_split: str = field(default="train", metadata={"help": "split to train on"})
    eval_split: str = field(default="validation", metadata={"help": "held out from the train split when missing"})
    max_train_samples: int | None = field(default=None, metadata={"help": "only the first N training pairs"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "only the first N evaluation pairs"})
    max_source_length: int = field(default=256, metadata={"help": "longer sources are truncated (tokens)"})
    max_target_length: int = field(default=256, metadata={"help": "longer targets are truncated (tokens)"})

    def __post_init__(self):
        if (self.dataset_dir is None) == (self.dataset is None):
            raise UsageError("give exactly one of --dataset_dir and --dataset.")


@dataclass
class AdapterArguments:
    _argument_group_name = "LoRA (peft)"
    lora_r: int | None = field(
        default=None, metadata={"help": "train LoRA adapters of this rank; default: every weight"}
    )
    lora_alpha: int = field(default=16, metadata={"help": "LoRA's scale: the adapter's update times alpha / r"})
    lora_dropout: float = field(default=0.1, metadata={"help": "dropout on the adapters' input (paper's P_drop)"})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(LORA_TARGET_MODULES), metadata={"help": "the layers that get adapters"}
    )
    merge: bool = field(default=False, metadata={"help": "also write the model with the adapter merged in"})

    def __post_init__(self):
        if self.lora_r is not None and self.lora_r < 1:
            raise UsageError(f"--lora_r must be a positive rank, got {self.lora_r}.")
        if self.merge and self.lora_r is None:
            raise UsageError("--merge merges a LoRA adapter: give --lora_r too.")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The flags with their defaults; the description and the epilog (the Trainer's flags, the data, the usage) laid
    out as this module's docstring lays them out."""


def parse_args(argv=None):
    """(ModelArguments, DataArguments, AdapterArguments, FinetuningArguments) from the command line, as transformers'
    run_translation.py reads its own: this command's flags, then every Seq2SeqTrainingArguments flag."""
    from vaswani.finetuning.trainer import FinetuningArguments

    description, rest = __doc__.split("\n\n", 1)
    return parse_arguments(
        (ModelArguments, DataArguments, AdapterArguments, FinetuningArguments),
        argv,
        description,
        epilog=rest,
        formatter_class=HelpFormatter,
    )


def load_splits(data, seed):
    """The raw training and evaluation splits; without the evaluation split, part of the training split."""
    from vaswani.training.data import check_translation_split, load_translation_dataset

    name, flag = (data.dataset_dir, "--dataset_dir") if data.dataset_dir else (data.dataset, "--dataset")
    dataset = load_translation_dataset(
        name,
        data.source_lang,
        data.target_lang,
        splits=(data.train_split,),
        config_name=data.dataset_config,
        flag=flag,
    )
    if data.eval_split in dataset:
        check_translation_split(dataset, data.eval_split, data.source_lang, data.target_lang, f"{flag} {name}")
        train, evaluation = dataset[data.train_split], dataset[data.eval_split]
    else:
        held_out = min(1000, max(1, len(dataset[data.train_split]) // 20))
        print(f"{name} has no split {data.eval_split!r}: holding out {held_out} training pairs for evaluation")
        parts = dataset[data.train_split].train_test_split(test_size=held_out, seed=seed)
        train, evaluation = parts["train"], parts["test"]
    if data.max_train_samples is not None:
        train = train.select(range(min(data.max_train_samples, len(train))))
    if data.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(data.max_eval_samples, len(evaluation))))
    return train, evaluation


def tokenize_function(tokenizer, source_lang, target_lang, max_source_length, max_target_length):
    """Map a batch of rows to input_ids / attention_mask (source) and labels (target, ending in </s>)."""

    def tokenize(batch):
        sources = [pair[source_lang] for pair in batch["translation"]]
        targets = [pair[target_lang] for pair in batch["translation"]]
        features = tokenizer(sources, max_length=max_source_length, truncation=True)
        features["labels"] = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)["input_ids"]
        return features

    return tokenize


def checkpoint_to_resume(choice, output_dir):
    """The checkpoint folder to continue from, or None to start afresh."""
    if choice is None:
        return None
    from transformers.trainer_utils import get_last_checkpoint

    if choice == "latest":
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        print(f"resuming from {last}" if last else f"no checkpoint in {output_dir} yet: starting afresh")
        return last
    if not Path(choice).is_dir():
        raise UsageError(f"checkpoint {choice} does not exist.")
    return choice


def build_trainer(data_args, training_args, model, tokenizer, train_raw, eval_raw):
    """Tokenize the two splits and put them, the model and the training arguments into a Seq2SeqTrainer."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    from vaswani.finetuning.trainer import KeepGenerationConfig, bleu_metrics

    # The positional encoding stops at max_position_embeddings: no input, label or translation may be longer.
    longest = getattr(model.config, "max_position_embeddings", None) or sys.maxsize
    max_source_length = min(data_args.max_source_length, longest)
    max_target_length = min(data_args.max_target_length, longest)
    # Without a limit asked for, a vaswani model decodes as vaswani-evaluate does: each sentence stops at its own
    # source length + 50 (its generate()); a model of another class without a limit of its own, at max_target_length.
    limit = training_args.generation_max_length
    generation = model.generation_config
    own_limit = model.config.model_type == "vaswani" or generation.max_length or generation.max_new_tokens
    if limit is None and not own_limit:
        limit = max_target_length
    training_args.generation_max_length = None if limit is None else min(limit, longest)
    tokenize = tokenize_function(
        tokenizer, data_args.source_lang, data_args.target_lang, max_source_length, max_target_length
    )
    train_dataset = train_raw.map(tokenize, batched=True, remove_columns=train_raw.column_names, desc="tokenizing")
    eval_dataset = eval_raw.map(tokenize, batched=True, remove_columns=eval_raw.column_names, desc="tokenizing")
    return Seq2SeqTrainer(
        model=model,
        args=training_args,
        # With the model, the collator also builds decoder_input_ids from the labels: Trainer takes the labels away
        # from the model when it smooths them itself, and the model could no longer build them.
        data_collator=DataCollatorForSeq2Seq(
            tokenizer, model=model, pad_to_multiple_of=8 if training_args.bf16 else None
        ),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=bleu_metrics(tokenizer, data_args.target_lang),
        callbacks=[KeepGenerationConfig(model.generation_config)],
    )


def with_adapters(model, adapter_args):
    """The model wrapped by peft with LoRA adapters (`get_peft_model`): only the adapters train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        task_type="SEQ_2_SEQ_LM",
        r=adapter_args.lora_r,
        lora_alpha=adapter_args.lora_alpha,
        lora_dropout=adapter_args.lora_dropout,
        target_modules=list(adapter_args.lora_target_modules),
    )
    model = get_peft_model(model, config)
    trainable, total = model.get_nb_trainable_parameters()
    print(f"LoRA r={adapter_args.lora_r}: {trainable:,} of {total:,} parameters train ({trainable / total:.2%})")
    return model


def check_model_arguments(model_args):
    """--model and --tokenizer, before any time is spent: folders that exist and hold what they should, or Hub ids."""
    # A folder whose code runs (--trust_remote_code) may be of any type; otherwise one the library's classes load.
    types = None if model_args.trust_remote_code else seq2seq_model_types()
    check_model_folder(model_args.model, model_types=types, hub=True)
    if model_args.tokenizer is not None:
        check_tokenizer_folder(model_args.tokenizer, hub=True)


def load_model(model_args):
    """The model and tokenizer to fine-tune, from folders or the Hub; what cannot be loaded is named."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    remote_code = model_args.trust_remote_code
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_args.tokenizer or model_args.model, trust_remote_code=remote_code
        )
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model, trust_remote_code=remote_code)
    except OSError as error:  # a Hub id that cannot be fetched (offline, no such repo), files missing from a folder
        raise UsageError(f"cannot load --model {model_args.model}: {str(error).splitlines()[0]}") from error
    return model, tokenizer


@command(extra="train", needs=("accelerate", "datasets", "sacrebleu", "sacremoses", "evaluate"))
def main(argv=None):
    model_args, data_args, adapter_args, training_args = parse_args(argv)
    check_writable_dir(training_args.output_dir)
    resume_from = checkpoint_to_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    if data_args.dataset_dir is not None:
        check_dataset_exists(data_args.dataset_dir)
    else:
        check_dataset_exists(data_args.dataset, "--dataset")
    check_model_arguments(model_args)
    train_raw, eval_raw = load_splits(data_args, training_args.seed)
    model, tokenizer = load_model(model_args)
    check_tokenizer_matches_config(tokenizer, model.config, f"the model {model_args.model}")
    print(
        f"{len(train_raw)} training and {len(eval_raw)} evaluation pairs, {data_args.source_lang} -> "
        f"{data_args.target_lang}; model {model_args.model}: {model.num_parameters():,} parameters, vocabulary "
        f"{model.config.vocab_size}"
    )

    if adapter_args.lora_r is not None:
        check_extra("vaswani-finetune --lora_r", "lora", ("peft",))
        model = with_adapters(model, adapter_args)
    trainer = build_trainer(data_args, training_args, model, tokenizer, train_raw, eval_raw)
    train_result = trainer.train(resume_from_checkpoint=resume_from)
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    # The pair counts, as transformers' run_translation.py records them: an evaluation of --max_eval_samples pairs
    # says it is one.
    train_metrics = {**train_result.metrics, "trainable_parameters": trainable, "train_samples": len(train_raw)}
    trainer.log_metrics("train", train_metrics)
    trainer.save_metrics("train", train_metrics)  # OUTPUT_DIR/train_results.json

    metrics = {**trainer.evaluate(), "eval_samples": len(eval_raw)}
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)  # OUTPUT_DIR/eval_results.json
    trainer.save_model()  # the model (with its code) or the adapter, and the tokenizer, in OUTPUT_DIR
    trainer.save_state()  # OUTPUT_DIR/trainer_state.json, the whole log
    print(
        f"saved the fine-tuned {'adapter' if adapter_args.lora_r else 'model'} and tokenizer to {training_args.output_dir}"
    )
    if adapter_args.merge and trainer.is_world_process_zero():
        merged_dir = Path(training_args.output_dir) / "merged"
        trainer.model.merge_and_unload().save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
        print(f"saved the model with the adapter merged in to {merged_dir}")

    if training_args.push_to_hub:
        trainer.push_to_hub(
            commit_message="Fine-tuned with vaswani-finetune",
            finetuned_from=model_args.model,
            tasks="translation",
            language=[data_args.source_lang, data_args.target_lang],
            dataset=data_args.dataset or Path(data_args.dataset_dir).name,
        )
    return metrics


if __name__ == "__main__":
    main()
