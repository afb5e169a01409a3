"""Fine-tune a trained Transformer on a new sentence-pair set with the `transformers` Seq2SeqTrainer.

Where scripts/train.py follows the paper's recipe, this script is the usual Hugging Face fine-tuning loop, so that any
tool built around Trainer (checkpoints, resuming, gradient accumulation, mixed precision, the Hub) works unchanged:

  - the model and its tokenizer are loaded with AutoModelForSeq2SeqLM / AutoTokenizer, from a folder or a Hub repo
    (`--trust_remote_code` for a Hub repo of this model when the `vaswani` package is not installed);
  - batches are padded by DataCollatorForSeq2Seq, which also builds the decoder input from the labels;
  - the loss is label-smoothed cross-entropy, epsilon = 0.1 as in the paper (section 5.4);
  - with gradient accumulation, Trainer counts the labelled tokens of all accumulated micro-batches and passes that
    count (`num_items_in_batch`) to the loss, so an accumulated step has exactly the gradient of one big batch;
  - evaluation translates the evaluation split with beam search and scores it with sacreBLEU (eval_bleu); its
    eval_loss is the label-smoothed loss, like the training loss;
  - the final model and tokenizer are saved to OUTPUT_DIR, with `eval_results.json` (the final evaluation) and
    `trainer_state.json` (the log of the run).

The data is a DatasetDict whose rows hold {"translation": {SOURCE_LANG: str, TARGET_LANG: str}}, either saved by
scripts/prepare_data.py (`--dataset_dir`) or loaded with datasets.load_dataset (`--dataset`). Without the evaluation
split, a part of the training split is held out for it.

Usage:
  python scripts/finetune.py --model runs/base --dataset_dir data/new --output_dir runs/finetuned
  python scripts/finetune.py --model runs/base --dataset_dir data/new --output_dir runs/finetuned \\
      --per_device_train_batch_size 16 --gradient_accumulation_steps 4 --max_steps 2000 --eval_steps 250
  python scripts/finetune.py ... --resume_from_checkpoint            # continue from OUTPUT_DIR's last checkpoint
  python scripts/finetune.py ... --push_to_hub --hub_model_id me/vaswani-en-es-finetuned
"""

import argparse
import copy
import dataclasses
import sys
from pathlib import Path

import datasets
import numpy as np
import sacrebleu
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
)
from transformers.trainer_utils import get_last_checkpoint

try:  # registers model_type "vaswani" with the Auto classes; without the package, --trust_remote_code is needed
    import vaswani  # noqa: F401
except ImportError:
    vaswani = None

# Note: this script does not use the `evaluate` package: `evaluate.load("sacrebleu")` downloads the metric's script
# from the Hugging Face Hub at run time, which fails offline and runs code fetched from the network. sacreBLEU itself
# is a dependency, called directly below. (Also, scripts/evaluate.py shadows that package for scripts in this folder.)


# transformers 5.x renamed TrainingArguments.gradient_checkpointing to activation_checkpointing (the old name warns).
CHECKPOINTING_FIELD = next(name for name in ("activation_checkpointing", "gradient_checkpointing")
                           if name in {field.name for field in dataclasses.fields(Seq2SeqTrainingArguments)})


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model = parser.add_argument_group("model")
    model.add_argument("--model", required=True, help="folder or Hub repo of the model to fine-tune")
    model.add_argument("--tokenizer", default=None, help="tokenizer folder or repo; default: the model's")
    model.add_argument("--trust_remote_code", action="store_true",
                       help="run the modelling code stored with the model (a Hub repo, without the vaswani package)")

    data = parser.add_argument_group("data")
    source = data.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset_dir", help="DatasetDict saved with save_to_disk (scripts/prepare_data.py)")
    source.add_argument("--dataset", help="name of a dataset for datasets.load_dataset")
    data.add_argument("--dataset_config", default=None, help="configuration name for --dataset")
    data.add_argument("--source_lang", default="en", help="key of the source side in the translation column")
    data.add_argument("--target_lang", default="es", help="key of the target side in the translation column")
    data.add_argument("--train_split", default="train", help="split to train on")
    data.add_argument("--eval_split", default="validation", help="held out from the train split when missing")
    data.add_argument("--max_train_samples", type=int, default=None, help="only the first N training pairs")
    data.add_argument("--max_eval_samples", type=int, default=None, help="only the first N evaluation pairs")
    data.add_argument("--max_source_length", type=int, default=256, help="longer sources are truncated (tokens)")
    data.add_argument("--max_target_length", type=int, default=256, help="longer targets are truncated (tokens)")

    train = parser.add_argument_group("training (Seq2SeqTrainingArguments)")
    train.add_argument("--output_dir", required=True, help="checkpoints, then the final model and tokenizer")
    train.add_argument("--optim", default="adamw_torch", help="optimizer name, as in TrainingArguments.optim")
    train.add_argument("--learning_rate", type=float, default=5e-5, help="peak learning rate")
    train.add_argument("--lr_scheduler_type", default="linear", help="linear, cosine, constant, inverse_sqrt, ...")
    train.add_argument("--warmup_steps", type=float, default=0,
                       help="warmup steps, or a fraction of all steps when below 1")
    train.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay")
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping; 0 switches it off")
    train.add_argument("--num_train_epochs", type=float, default=3.0, help="passes over the training split")
    train.add_argument("--max_steps", type=int, default=-1, help="total optimizer steps; overrides the epochs")
    train.add_argument("--per_device_train_batch_size", type=int, default=32, help="sentence pairs per micro-batch")
    train.add_argument("--per_device_eval_batch_size", type=int, default=32, help="sentences per evaluation batch")
    train.add_argument("--gradient_accumulation_steps", type=int, default=1,
                       help="micro-batches per optimizer step (the loss is normalised over all their tokens)")
    train.add_argument("--label_smoothing_factor", type=float, default=0.1, help="epsilon_ls (paper: 0.1)")
    train.add_argument("--gradient_checkpointing", "--activation_checkpointing", action="store_true",
                       help="recompute activations in the backward pass: less memory, about a third slower")
    train.add_argument("--bf16", nargs="?", const="true", default="auto", choices=["auto", "true", "false"],
                       help="bfloat16 mixed precision; auto: when the CUDA device supports it")
    train.add_argument("--use_cpu", action="store_true", help="train on the CPU even when a GPU is present")
    train.add_argument("--seed", type=int, default=42, help="seed of the data order and dropout")
    train.add_argument("--logging_steps", type=int, default=50, help="log the training loss every N steps")
    train.add_argument("--eval_strategy", default="steps", choices=["no", "steps", "epoch"], help="when to evaluate")
    train.add_argument("--eval_steps", type=int, default=500, help="evaluate every N steps")
    train.add_argument("--eval_on_start", action="store_true",
                       help="also evaluate before the first step (logged in trainer_state.json)")
    train.add_argument("--save_strategy", default="steps", choices=["no", "steps", "epoch"],
                       help="when to save a checkpoint")
    train.add_argument("--save_steps", type=int, default=500, help="save a checkpoint every N steps")
    train.add_argument("--save_total_limit", type=int, default=3, help="older checkpoints are deleted")
    train.add_argument("--resume_from_checkpoint", nargs="?", const="latest", default=None, metavar="PATH|latest",
                       help="continue from a checkpoint folder; 'latest' (or the bare flag): OUTPUT_DIR's last one")
    train.add_argument("--report_to", default="none", help="none, tensorboard, ...")

    evaluation = parser.add_argument_group("evaluation by translation")
    evaluation.add_argument("--num_beams", type=int, default=4, help="beam size (paper: 4); 1 is greedy")
    evaluation.add_argument("--generation_max_length", type=int, default=None,
                            help="longest translation in tokens, </s> included; default: --max_target_length")

    hub = parser.add_argument_group("Hugging Face Hub")
    hub.add_argument("--push_to_hub", action="store_true", help="push checkpoints and the final model")
    hub.add_argument("--hub_model_id", default=None, help="user/name of the repo; default: OUTPUT_DIR's name")
    hub.add_argument("--hub_private_repo", action="store_true", help="create the repo private")
    return parser.parse_args(argv)


def load_splits(args):
    """The raw training and evaluation splits, checked for the two language columns."""
    if args.dataset_dir is not None:
        if not Path(args.dataset_dir).is_dir():
            raise ValueError(f"dataset directory {args.dataset_dir} does not exist.")
        dataset = datasets.load_from_disk(args.dataset_dir)
        name = args.dataset_dir
    else:
        dataset = datasets.load_dataset(args.dataset, args.dataset_config)
        name = args.dataset
    if not isinstance(dataset, datasets.DatasetDict):
        dataset = datasets.DatasetDict({args.train_split: dataset})
    if args.train_split not in dataset:
        raise ValueError(f"{name} has no split {args.train_split!r} (it has {sorted(dataset)}); see --train_split.")
    for split in dataset.values():
        check_language_columns(split, args.source_lang, args.target_lang, name)

    train = dataset[args.train_split]
    if args.eval_split in dataset:
        evaluation = dataset[args.eval_split]
    else:
        held_out = min(1000, max(1, len(train) // 20))
        print(f"{name} has no split {args.eval_split!r}: holding out {held_out} training pairs for evaluation")
        parts = train.train_test_split(test_size=held_out, seed=args.seed)
        train, evaluation = parts["train"], parts["test"]
    if args.max_train_samples is not None:
        train = train.select(range(min(args.max_train_samples, len(train))))
    if args.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(args.max_eval_samples, len(evaluation))))
    return train, evaluation


def check_language_columns(split, source_lang, target_lang, name="the dataset"):
    """Refuse a split whose `translation` column lacks the source or the target language, naming what is missing."""
    if "translation" not in split.column_names:
        raise ValueError(f"{name} has no 'translation' column (its columns: {split.column_names}); expected rows "
                         f"like {{'translation': {{'{source_lang}': ..., '{target_lang}': ...}}}}.")
    feature = split.features["translation"]
    languages = list(feature.languages) if hasattr(feature, "languages") else list(feature)
    for role, lang in (("source", source_lang), ("target", target_lang)):
        if lang not in languages:
            raise ValueError(f"{name}: the {role} language column {lang!r} is not in the 'translation' column "
                             f"(it has {languages}); choose it with --{role}_lang.")


def check_vocabulary(tokenizer, config):
    """Refuse a tokenizer and a model that do not share the vocabulary: ids the embedding lacks would crash
    training, and different special ids would teach the model the wrong padding or end of sentence."""
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary has only "
                         f"{config.vocab_size} (config.vocab_size): ids from {config.vocab_size} on have no "
                         "embedding. Use the tokenizer the model was trained with.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no padding token; the model pads with id "
                         f"{config.pad_token_id} (config.pad_token_id).")
    for token in ("pad", "eos", "bos"):
        tokenizer_id, model_id = getattr(tokenizer, f"{token}_token_id"), getattr(config, f"{token}_token_id")
        if tokenizer_id is not None and model_id is not None and tokenizer_id != model_id:
            raise ValueError(f"the {token} token id differs: the tokenizer's is {tokenizer_id} "
                             f"({getattr(tokenizer, f'{token}_token')!r}), the model's config.{token}_token_id is "
                             f"{model_id}. Use the tokenizer the model was trained with.")


def tokenize_function(tokenizer, source_lang, target_lang, max_source_length, max_target_length):
    """Map a batch of rows to input_ids / attention_mask (source) and labels (target, ending in </s>)."""
    def tokenize(batch):
        sources = [pair[source_lang] for pair in batch["translation"]]
        targets = [pair[target_lang] for pair in batch["translation"]]
        features = tokenizer(sources, max_length=max_source_length, truncation=True)
        features["labels"] = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)["input_ids"]
        return features
    return tokenize


def bleu_metrics(tokenizer):
    """`compute_metrics` for predict_with_generate: sacreBLEU corpus BLEU (default 13a tokenisation, on detokenised
    text, as scripts/evaluate.py reports it) and the mean translation length in tokens."""
    def compute_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        # The evaluation loop pads batches to a common length with -100, which is no token.
        predictions = np.where(predictions != -100, predictions, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        bleu = sacrebleu.corpus_bleu(hypotheses, [references])
        lengths = (predictions != tokenizer.pad_token_id).sum(axis=1)
        return {"bleu": bleu.score, "gen_len": float(lengths.mean())}
    return compute_metrics


class KeepGenerationConfig(TrainerCallback):
    """Put the model's generation config back after each evaluation.

    Seq2SeqTrainer.prediction_step fills every unset field of `model.generation_config` with the library defaults,
    max_length=20 among them; that would switch off the model's own limit (source length + 50, section 6.1) and be
    saved with every later checkpoint and with the final model.
    """

    def __init__(self, generation_config):
        self.generation_config = copy.deepcopy(generation_config)

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        if model is not None:
            model.generation_config = copy.deepcopy(self.generation_config)


def use_bf16(choice, use_cpu):
    if choice == "auto":
        return not use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return choice == "true"


def checkpoint_to_resume(choice, output_dir):
    """The checkpoint folder to continue from, or None to start afresh."""
    if choice is None:
        return None
    if choice == "latest":
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        print(f"resuming from {last}" if last else f"no checkpoint in {output_dir} yet: starting afresh")
        return last
    if not Path(choice).is_dir():
        raise ValueError(f"checkpoint {choice} does not exist.")
    return choice


def build_trainer(args, model, tokenizer, train_raw, eval_raw):
    """Tokenize the two splits and put them, the model and the training arguments into a Seq2SeqTrainer."""
    # The positional encoding stops at max_position_embeddings: no input, label or translation may be longer.
    longest = getattr(model.config, "max_position_embeddings", None) or sys.maxsize
    max_source_length, max_target_length = min(args.max_source_length, longest), min(args.max_target_length, longest)
    generation_max_length = min(args.generation_max_length or max_target_length, longest)
    tokenize = tokenize_function(tokenizer, args.source_lang, args.target_lang, max_source_length, max_target_length)
    train_dataset = train_raw.map(tokenize, batched=True, remove_columns=train_raw.column_names, desc="tokenizing")
    eval_dataset = eval_raw.map(tokenize, batched=True, remove_columns=eval_raw.column_names, desc="tokenizing")

    bf16 = use_bf16(args.bf16, args.use_cpu)
    warmup_steps = int(args.warmup_steps) if args.warmup_steps >= 1 else args.warmup_steps
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.output_dir,
        optim=args.optim,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        num_train_epochs=args.num_train_epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        label_smoothing_factor=args.label_smoothing_factor,
        **{CHECKPOINTING_FIELD: args.gradient_checkpointing},
        bf16=bf16,
        use_cpu=args.use_cpu,
        seed=args.seed,
        logging_steps=args.logging_steps,
        eval_strategy=args.eval_strategy,
        eval_steps=args.eval_steps,
        eval_on_start=args.eval_on_start,
        save_strategy=args.save_strategy,
        save_steps=args.save_steps,
        save_total_limit=args.save_total_limit,
        predict_with_generate=True,
        generation_num_beams=args.num_beams,
        generation_max_length=generation_max_length,
        report_to=args.report_to,
        push_to_hub=args.push_to_hub,
        hub_model_id=args.hub_model_id,
        hub_private_repo=args.hub_private_repo or None,
    )
    return Seq2SeqTrainer(
        model=model,
        args=training_args,
        # With the model, the collator also builds decoder_input_ids from the labels: Trainer takes the labels away
        # from the model when it smooths them itself, and the model could no longer build them.
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=8 if bf16 else None),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=bleu_metrics(tokenizer),
        callbacks=[KeepGenerationConfig(model.generation_config)],
    )


def main(argv=None):
    args = parse_args(argv)
    try:
        resume_from = checkpoint_to_resume(args.resume_from_checkpoint, args.output_dir)
        train_raw, eval_raw = load_splits(args)
        remote_code = args.trust_remote_code
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model, trust_remote_code=remote_code)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model, trust_remote_code=remote_code)
        check_vocabulary(tokenizer, model.config)
    except ValueError as error:
        raise SystemExit(f"finetune.py: error: {error}") from error
    print(f"{len(train_raw)} training and {len(eval_raw)} evaluation pairs, {args.source_lang} -> {args.target_lang}; "
          f"model {args.model}: {model.num_parameters():,} parameters, vocabulary {model.config.vocab_size}")

    trainer = build_trainer(args, model, tokenizer, train_raw, eval_raw)
    train_result = trainer.train(resume_from_checkpoint=resume_from)
    trainer.log_metrics("train", train_result.metrics)
    trainer.save_metrics("train", train_result.metrics)

    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)  # OUTPUT_DIR/eval_results.json
    trainer.save_model()  # the model (with its code) and the tokenizer, in OUTPUT_DIR
    trainer.save_state()  # OUTPUT_DIR/trainer_state.json, the whole log
    print(f"saved the fine-tuned model and tokenizer to {args.output_dir}")

    if args.push_to_hub:
        trainer.push_to_hub(
            commit_message="Fine-tuned with scripts/finetune.py",
            finetuned_from=args.model,
            tasks="translation",
            language=[args.source_lang, args.target_lang],
            dataset=args.dataset or Path(args.dataset_dir).name,
        )
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
