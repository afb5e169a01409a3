"""The training recipe of "Attention Is All You Need" (section 5) as a library: `vaswani.training`.

    data         translation pairs tokenized once into Arrow, padded into batches (5.1)
    batching     token-bucket batches of pairs of similar length, and each step's batches from where a run stands (5.1)
    padding      a batch of pairs as the model's inputs: padding, the decoder input shifted right
    step         one optimizer step: the loss over the step's tokens, accumulation, the update (5.2-5.4)
    schedule     warmup, then the inverse square root of the step (5.3)
    checkpoints  save, keep, resume and average checkpoints (6.1)
    run          a run's life in its folder: its model config, afresh or resumed with the same settings, the
                 checkpoint grid, why it stops early, the final average (6.1); the loop's callbacks
    faults       preemption signals, non-finite losses, disk space
    distributed  the processes `accelerate launch` started (DDP, FSDP2, DeepSpeed), and whether the model compiles
    validation   the validation loss and BLEU during training, the processes in step
    records      the progress bar, the step log, the summary, the plots, the hardware
    arguments    vaswani-train's flags, which the recipe's parts read
The label-smoothed loss (5.4) is the model's own: `vaswani.label_smoothed_cross_entropy`, also used by its `labels`
path. Beside the recipe, in rooms of their own: `vaswani.corpora` (building a corpus, the tokenizer),
`vaswani.evaluation` (translating a test set, BLEU), `vaswani.finetuning` (Seq2SeqTrainer), `vaswani.hub` (push,
model card), `vaswani.export` (CTranslate2).
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that `import vaswani.training` costs nothing until a name is used.
_EXPORTS = {
    "checkpoints": ["TrainState", "average_checkpoints", "list_checkpoints", "load_weights_into", "save_checkpoint"],
    "run": ["TrainingCallback", "TrainingRun", "model_config"],
    "records": ["TrainingReport"],
    "arguments": ["TrainArguments"],
    "batching": ["StepBatches", "TokenBucketSampler", "paper_batch_tokens"],
    "padding": ["pair_batch"],
    "step": ["StepResult", "train_step"],
    "data": [
        "PairCollator",
        "TokenizedSplit",
        "TrainingData",
        "load_translation_dataset",
        "pair_loader",
        "tokenize_split",
    ],
    "faults": ["StopSignal"],
    "validation": ["validate"],
    "schedule": ["inverse_sqrt_lr", "inverse_sqrt_schedule", "paper_peak_lr"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
