"""scripts/finetune.py (vaswani-finetune): Seq2SeqTrainer fine-tuning of a saved model on a new pair set.

Everything runs on the CPU with a tiny model, a word-level tokenizer and a few dozen made-up English-Spanish pairs.
"""

import json
import shutil
import subprocess
import sys

import datasets
import numpy as np
import pytest
import torch
from helpers import save_pairs, word_tokenizer
from safetensors.torch import load_file
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    LogitsProcessor,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_pt_utils import LabelSmoother

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.checks import UsageError
from vaswani.scripts import evaluate_bleu, finetune


NOUNS = {"cat": "gato", "dog": "perro", "boy": "niño", "bird": "pájaro", "horse": "caballo", "man": "hombre"}
VERBS = {"eats": "come", "runs": "corre", "sleeps": "duerme", "sings": "canta", "jumps": "salta", "reads": "lee"}
# 36 pairs of 5 and 6 words: long enough for 4-grams, so that BLEU can be above zero.
PAIRS = [
    {"en": f"the {noun} {verb} every day", "es": f"el {noun_es} {verb_es} todos los días"}
    for noun, noun_es in NOUNS.items()
    for verb, verb_es in VERBS.items()
]
WORDS = sorted({word for pair in PAIRS for sentence in pair.values() for word in sentence.split()})


def finetune_tokenizer(**options):
    """The word-level tokenizer of these pairs, without a decoder (the same ids as another tokenizer)."""
    return word_tokenizer(words=WORDS, decoder=False, **options)


def save_model(folder, tokenizer, seed=0, vocab_size=None, dropout=0.1):
    """A 'pretrained' tiny model (random weights) saved with its tokenizer, as finetune.py --model expects."""
    torch.manual_seed(seed)
    config = VaswaniConfig.from_preset(
        "tiny", vocab_size=vocab_size or len(tokenizer), dropout=dropout, max_position_embeddings=64
    )
    VaswaniForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_finetune(model, dataset_dir, output_dir, *flags):
    """finetune.main with the flags every test wants: CPU, no reporting, greedy and short evaluation translations."""
    paths = ["--model", str(model), "--dataset_dir", str(dataset_dir), "--output_dir", str(output_dir)]
    common = (
        "--use_cpu --report_to none --generation_num_beams 1 --generation_max_length 12 --eval_strategy no "
        "--save_strategy no --logging_steps 1 --warmup_steps 0"
    )
    return finetune.main([*paths, *common.split(), *flags])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A tokenizer, a tiny pretrained model and the pair set, saved once for the module."""
    root = tmp_path_factory.mktemp("finetune")
    tokenizer = finetune_tokenizer()
    return {
        "root": root,
        "tokenizer": tokenizer,
        "model": save_model(root / "pretrained", tokenizer),
        "data": save_pairs(root / "data", PAIRS),
    }


def test_finetuning_lowers_eval_loss_and_raises_bleu(workspace, tmp_path, capsys):
    output_dir = tmp_path / "finetuned"
    flags = "--eval_on_start --max_steps 30 --learning_rate 5e-3 --per_device_train_batch_size 8".split()
    metrics = run_finetune(workspace["model"], workspace["data"], output_dir, *flags)
    printed, progress = capsys.readouterr()  # as a log gets them: the logging steps' figures, no bar
    assert "'loss':" in printed and "'eval_bleu':" in printed and "%|" not in progress

    state = json.loads((output_dir / "trainer_state.json").read_text())
    before = next(entry for entry in state["log_history"] if "eval_bleu" in entry)  # --eval_on_start, step 0
    after = json.loads((output_dir / "eval_results.json").read_text())
    assert before["step"] == 0 and state["global_step"] == 30
    assert after == pytest.approx(metrics)
    assert after["eval_loss"] < 0.7 * before["eval_loss"], (before, after)
    assert after["eval_bleu"] > before["eval_bleu"] + 10, (before, after)

    # The saved model and tokenizer reload and translate; the evaluation did not leave the library's default
    # max_length=20 in the generation config (the model's own limit is source length + 50).
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    reloaded = VaswaniForConditionalGeneration.from_pretrained(output_dir).eval()
    source = tokenizer(["the dog sings every day"], return_tensors="pt")
    assert reloaded.generate(**source, num_beams=1).shape[0] == 1
    saved = GenerationConfig.from_pretrained(output_dir)
    pretrained = GenerationConfig.from_pretrained(workspace["model"])
    assert (saved.max_length, saved.num_beams) == (pretrained.max_length, 4), (
        "evaluation changed the generation config"
    )


def long_pair(k):
    """Four clauses in one sentence, 20 words to 24: a translation longer than transformers' default max_length (20)."""
    nouns, verbs = list(NOUNS.items()), list(VERBS.items())
    clauses = [(nouns[(k + c) % len(nouns)], verbs[(2 * k + c) % len(verbs)]) for c in range(4)]
    return {
        "en": " ".join(f"the {noun} {verb} every day" for (noun, _), (verb, _) in clauses),
        "es": " ".join(f"el {noun} {verb} todos los días" for (_, noun), (_, verb) in clauses),
    }


class DiscourageEnd(LogitsProcessor):
    """Takes 30 nats from </s>, so that no hypothesis ends before its limit makes it."""

    def __call__(self, input_ids, scores):
        scores[:, 2] -= 30.0
        return scores


def test_a_users_seq2seq_trainer_leaves_the_papers_decoding_in_the_model_it_saves(workspace, tmp_path):
    """A plain Seq2SeqTrainer with predict_with_generate=True, as a user writes it: its evaluation fills the model's
    generation config with transformers' defaults, max_length=20 among them, and save_model saves them. The model
    still decodes as section 6.1 says, during that evaluation and once reloaded: beam 4, length penalty 0.6, and
    each sentence's own limit of its source length + 50, so that a translation longer than 20 tokens is whole."""
    tokenizer = workspace["tokenizer"]
    pairs = [long_pair(0), long_pair(1)]

    def tokenize(batch):
        features = tokenizer([pair["en"] for pair in batch["translation"]])
        features["labels"] = tokenizer([pair["es"] for pair in batch["translation"]])["input_ids"]
        return features

    data = datasets.Dataset.from_dict({"translation": pairs}).map(
        tokenize, batched=True, remove_columns=["translation"]
    )
    model = VaswaniForConditionalGeneration.from_pretrained(save_model(tmp_path / "start", tokenizer, dropout=0.0))
    translations = []

    def compute_metrics(prediction):
        ids = np.where(prediction.predictions != -100, prediction.predictions, tokenizer.pad_token_id)
        translations.extend(tokenizer.batch_decode(ids, skip_special_tokens=True))
        return {}

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "trained"),
        predict_with_generate=True,
        use_cpu=True,
        report_to="none",
        max_steps=30,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        per_device_train_batch_size=2,
        per_device_eval_batch_size=1,  # two evaluation batches: the second decodes with the filled-in config
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=data,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    trainer.train()
    trainer.evaluate()
    trainer.save_model()

    targets = [pair["es"] for pair in pairs]
    assert translations == targets, "the evaluation cut its translations"
    saved = GenerationConfig.from_pretrained(tmp_path / "trained")
    assert saved.max_length == 20 and saved.top_k == 50  # what the Trainer filled in: the library's defaults

    reloaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "trained")
    config = reloaded.generation_config
    assert (config.num_beams, config.length_penalty, config.paper_decoding) == (4, 0.6, True)
    source = tokenizer([pairs[1]["en"]], return_tensors="pt")
    output = reloaded.generate(**source)
    assert output.shape[1] - 1 == len(targets[1].split()) + 1 > 20  # 24 words and </s>
    assert tokenizer.decode(output[0], skip_special_tokens=True) == targets[1]

    # Each sentence of a padded batch stops at its own source length + 50 (within the 64 positions).
    batch = tokenizer([pairs[1]["en"], "the cat eats every day"], padding=True, return_tensors="pt")
    assert batch["attention_mask"].sum(1).tolist() == [21, 6]
    forced = reloaded.generate(**batch, logits_processor=[DiscourageEnd()])
    assert (forced[:, 1:] != tokenizer.pad_token_id).sum(1).tolist() == [63, 6 + 50]
    # A max_length set by hand in the generation config, 20 included, is a limit.
    reloaded.generation_config = GenerationConfig.from_pretrained(tmp_path / "start")
    reloaded.generation_config.max_length = 20
    assert reloaded.generate(**source).shape[1] == 20


def test_the_records_count_the_pairs_a_run_trained_on_and_evaluated(workspace, tmp_path):
    """An evaluation of --max_eval_samples pairs says it is one, in the records the model card shows (the pair counts
    of transformers' run_translation.py)."""
    from vaswani.hub.model_card import render_model_card

    output_dir = tmp_path / "finetuned"
    flags = "--max_steps 2 --per_device_train_batch_size 4 --max_train_samples 6 --max_eval_samples 3".split()
    run_finetune(workspace["model"], workspace["data"], output_dir, *flags)
    assert json.loads((output_dir / "eval_results.json").read_text())["eval_samples"] == 3
    assert json.loads((output_dir / "train_results.json").read_text())["train_samples"] == 6
    assert {"train_samples": 6, "eval_samples": 3}.items() <= json.loads(
        (output_dir / "all_results.json").read_text()
    ).items()
    assert "| eval_samples | 3 |" in render_model_card(output_dir, "alice/finetuned")


def test_finetune_evaluates_with_the_decoding_and_score_of_vaswani_evaluate(workspace, tmp_path):
    """vaswani-finetune's evaluation decodes as vaswani-evaluate does (beam 4, the GNMT penalty, each sentence's own
    limit of its source length + 50, not one limit for all) and scores with the same metric: on the same model and
    sentences, the same BLEU. The model has random weights: its translations run to their limits, which decide the
    score."""
    model_dir = shutil.copytree(workspace["model"], tmp_path / "model")  # vaswani-evaluate writes next to it
    expected = evaluate_bleu.main(
        ["--model", model_dir, "--dataset_dir", workspace["data"], "--split", "validation", "--max_samples", "8"]
    )

    flags = "--use_cpu --report_to none --per_device_eval_batch_size 4 --max_eval_samples 8"
    paths = ["--model", str(model_dir), "--dataset_dir", str(workspace["data"]), "--output_dir", str(tmp_path / "ft")]
    _, data_args, _, args = finetune.parse_args([*paths, *flags.split()])
    train, evaluation = finetune.load_splits(data_args, args.seed)
    model = VaswaniForConditionalGeneration.from_pretrained(model_dir)
    metrics = finetune.build_trainer(data_args, args, model, workspace["tokenizer"], train, evaluation).evaluate()

    assert 0 < expected["score"] < 5
    assert metrics["eval_bleu"] == pytest.approx(expected["score"], abs=1e-9)
    assert metrics["eval_tokenized_bleu"] == pytest.approx(expected["tokenized_bleu"], abs=1e-9)
    assert metrics["eval_bleu_signature"] == expected["signature"]
    assert metrics["eval_chrf"] == pytest.approx(expected["chrf"], abs=1e-9) and 0 < expected["chrf"] < 100
    # The mean length: the start token and each sentence's 6 + 50 tokens (a random model rarely ends sooner).
    assert metrics["eval_gen_len"] <= 1 + 6 + 50


def final_weights(folder):
    return load_file(folder / "model.safetensors")


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_run(workspace, tmp_path):
    flags = "--max_steps 6 --save_strategy steps --save_steps 3 --learning_rate 1e-3 --per_device_train_batch_size 4"
    flags = (*flags.split(), "--max_eval_samples", "4", "--activation_checkpointing")
    uninterrupted = tmp_path / "uninterrupted"
    run_finetune(workspace["model"], workspace["data"], uninterrupted, *flags)

    # The interrupted run: its output folder holds only what existed at step 3. It is resumed from a model with
    # other weights, so that it can only end where the uninterrupted run did by continuing from the checkpoint.
    interrupted = tmp_path / "interrupted"
    shutil.copytree(uninterrupted / "checkpoint-3", interrupted / "checkpoint-3")
    other_start = save_model(tmp_path / "other_start", workspace["tokenizer"], seed=1)
    run_finetune(other_start, workspace["data"], interrupted, *flags, "--resume_from_checkpoint")

    state = json.loads((interrupted / "trainer_state.json").read_text())
    assert json.loads((interrupted / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert state["global_step"] == 6 and (interrupted / "checkpoint-6").is_dir()
    reference_log = json.loads((uninterrupted / "trainer_state.json").read_text())["log_history"]
    losses = {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}
    reference_losses = {entry["step"]: entry["loss"] for entry in reference_log if "loss" in entry}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses == pytest.approx(reference_losses, rel=1e-5)  # steps 4-6 saw the same batches and dropout

    expected, resumed = final_weights(uninterrupted), final_weights(interrupted)
    started_from = final_weights(other_start)
    assert resumed.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(resumed[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.allclose(started_from[name], expected[name]) for name in expected)


def seq2seq_example(generator, source_length, target_length):
    """Random ids (not special) ending in </s>: (source ids, label ids)."""
    source = torch.randint(4, 100, (source_length,), generator=generator)
    labels = torch.randint(4, 100, (target_length,), generator=generator)
    source[-1] = labels[-1] = 2
    return source, labels


def pad_batch(examples):
    """Right-pad sources with <pad> (masked) and labels with -100, as DataCollatorForSeq2Seq does."""
    source_length = max(len(source) for source, _ in examples)
    target_length = max(len(labels) for _, labels in examples)
    input_ids = torch.zeros(len(examples), source_length, dtype=torch.long)
    labels = torch.full((len(examples), target_length), -100)
    for row, (source, target) in enumerate(examples):
        input_ids[row, : len(source)] = source
        labels[row, : len(target)] = target
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


def model_loss(model, batch, num_items_in_batch=None):
    """The model's own loss, called the way Trainer calls it."""
    if num_items_in_batch is None:
        return model(**batch).loss
    return model(**batch, num_items_in_batch=num_items_in_batch).loss


def smoothed_loss(model, batch, num_items_in_batch=None):
    """Trainer's label smoothing (finetune.py's default, epsilon 0.1): the model gets no labels, only the decoder
    input that the collator builds from them."""
    labels = batch["labels"]
    outputs = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels),
    )
    return LabelSmoother(epsilon=0.1)(outputs, labels, num_items_in_batch=num_items_in_batch)


def gradients(model, losses):
    model.zero_grad()
    for loss in losses:
        loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


@pytest.mark.parametrize("loss_fn", [model_loss, smoothed_loss], ids=["model_loss", "label_smoothing"])
def test_gradient_accumulation_matches_one_double_batch(tiny_model, loss_fn):
    model = tiny_model.train()  # dropout 0 in tiny_config, so training mode is deterministic
    generator = torch.Generator().manual_seed(0)
    micro_batches = [
        [seq2seq_example(generator, 5, 2), seq2seq_example(generator, 4, 3)],
        [seq2seq_example(generator, 7, 6), seq2seq_example(generator, 3, 7)],
    ]
    padded = [pad_batch(examples) for examples in micro_batches]
    # What Trainer passes: the labelled tokens of all micro-batches of the optimizer step.
    counts = [int(batch["labels"].ne(-100).sum()) for batch in padded]
    assert counts == [5, 13]  # unequal, so that the normalisation matters
    num_items_in_batch = torch.tensor(sum(counts))

    double_batch = gradients(model, [loss_fn(model, pad_batch(micro_batches[0] + micro_batches[1]))])
    accumulated = gradients(model, [loss_fn(model, batch, num_items_in_batch) for batch in padded])
    mean_of_means = gradients(model, [loss_fn(model, batch) / len(padded) for batch in padded])

    assert double_batch.keys() == accumulated.keys()
    for name in double_batch:
        torch.testing.assert_close(accumulated[name], double_batch[name], rtol=1e-5, atol=1e-5, msg=name)
    largest_error = max((mean_of_means[name] - double_batch[name]).abs().max() for name in double_batch)
    assert largest_error > 1e-3, "the naive average should differ: the test would not see a wrong normalisation"


def test_trainer_step_with_accumulation_equals_one_double_batch_step(workspace, tmp_path):
    """finetune.py's trainer, one SGD step: 2 accumulated micro-batches of 4 pairs against one batch of 8."""
    # 37 labelled tokens in all, an odd number: however the 8 pairs are split, the two halves differ.
    pairs = [
        {"en": pair["en"], "es": " ".join(pair["es"].split()[:words])}
        for pair, words in zip(PAIRS, [1, 1, 2, 3, 4, 5, 6, 7])
    ]
    train = datasets.Dataset.from_dict({"translation": pairs})
    model_dir = save_model(tmp_path / "no_dropout", workspace["tokenizer"], dropout=0.0)

    def one_step(batch_size, accumulation):
        output_dir = str(tmp_path / f"ga{accumulation}")
        flags = (
            "--use_cpu --report_to none --save_strategy no --eval_strategy no --optim sgd --learning_rate 1.0 "
            f"--max_grad_norm 0 --max_steps 1 --per_device_train_batch_size {batch_size} "
            f"--gradient_accumulation_steps {accumulation}"
        )
        _, data_args, _, training_args = finetune.parse_args(
            ["--model", str(model_dir), "--dataset_dir", "unused", "--output_dir", output_dir, *flags.split()]
        )
        model = VaswaniForConditionalGeneration.from_pretrained(model_dir)
        trainer = finetune.build_trainer(data_args, training_args, model, workspace["tokenizer"], train, train)
        trainer.train()
        return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}

    start = dict(VaswaniForConditionalGeneration.from_pretrained(model_dir).named_parameters())
    accumulated, double_batch = one_step(4, 2), one_step(8, 1)
    assert any(not torch.allclose(double_batch[name], start[name]) for name in start)  # the step changed weights
    for name in double_batch:
        torch.testing.assert_close(accumulated[name], double_batch[name], rtol=1e-5, atol=1e-5, msg=name)


def test_missing_target_language_is_named(workspace, tmp_path):
    data = save_pairs(tmp_path / "en_fr", [{"en": "the cat", "fr": "le chat"}] * 4)
    with pytest.raises(SystemExit, match=r"'es'.*\['en', 'fr'\]"):
        run_finetune(workspace["model"], data, tmp_path / "out")


@pytest.mark.parametrize(
    ("tokenizer", "vocab_size", "message"),
    [
        (
            finetune_tokenizer(extra_words=("extra",)),
            len(WORDS) + 4,
            rf"tokenizer has {len(WORDS) + 5} tokens but the vocabulary of the model .* only {len(WORDS) + 4}",
        ),
        (
            finetune_tokenizer(special_tokens=["<s>", "<pad>", "</s>", "<unk>"]),
            None,
            r"config.pad_token_id of the model .* is 0 but the tokenizer's id is 1",
        ),
    ],
    ids=["tokenizer_bigger_than_model", "pad_id_differs"],
)
def test_tokenizer_that_disagrees_with_the_model_is_refused(workspace, tmp_path, tokenizer, vocab_size, message):
    model_dir = save_model(tmp_path / "model", finetune_tokenizer(), vocab_size=vocab_size)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    with pytest.raises(SystemExit, match=message):
        run_finetune(model_dir, workspace["data"], tmp_path / "out", "--tokenizer", str(tmp_path / "tokenizer"))


def parse(tmp_path, flags="", dataset_dir="d"):
    """finetune.parse_args with the required flags: (ModelArguments, DataArguments, AdapterArguments, FinetuningArguments)."""
    paths = ["--model", "m", "--dataset_dir", str(dataset_dir), "--output_dir", str(tmp_path / "out")]
    return finetune.parse_args([*paths, *flags.split()])


# The last check spells a flag as the script took it before transformers renamed it: the library warns, and takes it.
@pytest.mark.filterwarnings("default:`gradient_checkpointing` is deprecated:FutureWarning")
def test_defaults_are_the_scripts_not_the_librarys(tmp_path):
    _, data_args, _, args = parse(tmp_path, "--use_cpu")
    expected = {
        "optim": "adamw_torch",
        "per_device_train_batch_size": 32,
        "per_device_eval_batch_size": 32,
        "label_smoothing_factor": 0.1,
        "bf16": False,
        "logging_steps": 50,
        "eval_strategy": "steps",
        "eval_steps": 500,
        "save_steps": 500,
        "save_total_limit": 3,
        "predict_with_generate": True,
        "generation_num_beams": 4,
        "generation_max_length": None,
        "report_to": [],
        "resume_from_checkpoint": None,
    }
    assert {name: getattr(args, name) for name in expected} == expected
    library = Seq2SeqTrainingArguments(output_dir=str(tmp_path))
    assert library.label_smoothing_factor == 0.0 and not library.predict_with_generate  # so the defaults matter
    assert (data_args.source_lang, data_args.target_lang, data_args.max_source_length) == ("en", "es", 256)

    # The flags of the script before it took every Seq2SeqTrainingArguments flag, spelled as they were.
    assert parse(tmp_path, "--resume_from_checkpoint")[-1].resume_from_checkpoint == "latest"
    assert parse(tmp_path, "--resume_from_checkpoint runs/a/checkpoint-3")[-1].resume_from_checkpoint.endswith("-3")
    _, _, _, args = parse(tmp_path, "--num_beams 2 --hub_private_repo --use_cpu --bf16 false --gradient_checkpointing")
    parsed = (args.generation_num_beams, args.hub_private_repo, args.bf16, args.activation_checkpointing)
    assert parsed == (2, True, False, True)


def test_a_log_gets_the_logging_steps_lines_and_a_terminal_the_bar(tmp_path, monkeypatch):
    """Where the output is a log (pytest's captured stderr here), Trainer's bar is off and its PrinterCallback prints
    each logging step's figures; in a terminal the bar is on; the flag decides either way."""
    assert parse(tmp_path, "--use_cpu")[-1].disable_tqdm is True
    assert parse(tmp_path, "--use_cpu --disable_tqdm false")[-1].disable_tqdm is False
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert parse(tmp_path, "--use_cpu")[-1].disable_tqdm is False
    assert parse(tmp_path, "--use_cpu --disable_tqdm")[-1].disable_tqdm is True


def test_without_the_evaluation_split_part_of_the_training_split_is_held_out(tmp_path):
    folder = tmp_path / "train_only"
    datasets.DatasetDict(train=datasets.Dataset.from_dict({"translation": PAIRS})).save_to_disk(folder)
    _, data_args, _, args = parse(tmp_path, dataset_dir=folder)
    train, evaluation = finetune.load_splits(data_args, args.seed)
    assert (len(train), len(evaluation)) == (len(PAIRS) - 1, 1)  # a 20th, at least one
    assert evaluation[0]["translation"] not in train["translation"]


def test_evaluation_split_is_checked_like_the_training_split(tmp_path):
    folder = tmp_path / "bad_validation"
    train = datasets.Dataset.from_dict({"translation": PAIRS})
    validation = datasets.Dataset.from_dict({"translation": [{"en": "the cat", "fr": "le chat"}] * 2})
    datasets.DatasetDict(train=train, validation=validation).save_to_disk(folder)
    _, data_args, _, args = parse(tmp_path, dataset_dir=folder)
    with pytest.raises(UsageError, match=r"validation.*'es'"):
        finetune.load_splits(data_args, args.seed)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--model m --dataset_dir d", "the following arguments are required: --output_dir"),
        ("--model m --output_dir o", "give exactly one of --dataset_dir and --dataset"),
        ("--model m --dataset_dir d --dataset x --output_dir o", "give exactly one of --dataset_dir and --dataset"),
        ("--model m --dataset_dir d --output_dir o --max_steps -3", "--max_steps must be a positive number"),
        ("--model m --dataset_dir d --output_dir o --max_steps 0", "or -1 to train for --num_train_epochs; got 0"),
    ],
    ids=["no_output_dir", "no_dataset", "two_datasets", "negative_max_steps", "zero_max_steps"],
)
def test_bad_arguments_end_with_the_usage(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(flags.split())
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_missing_checkpoint_is_named_before_any_work(tmp_path):
    flags = ["--model", "m", "--dataset_dir", "d", "--output_dir", str(tmp_path), "--resume_from_checkpoint"]
    with pytest.raises(SystemExit, match=r"checkpoint .*/missing does not exist"):
        finetune.main([*flags, str(tmp_path / "missing")])


def test_help_lists_the_commands_own_flags_and_says_every_trainer_flag_is_taken(capsys):
    """--help answers before torch is imported (tests/test_command_mistakes.py), so it cannot list the fields of
    Seq2SeqTrainingArguments: it says they are taken, and with which defaults."""
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(["--help"])
    text = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert {"--model", "--dataset_dir", "--source_lang", "--max_target_length"} <= set(text.split())
    assert "Every Seq2SeqTrainingArguments flag is accepted too" in " ".join(text.split())


def test_max_steps_minus_one_still_means_train_for_the_epochs(tmp_path):
    flags = ["--model", "m", "--dataset_dir", "d", "--output_dir", str(tmp_path), "--num_train_epochs", "2"]
    _, _, _, args = finetune.parse_args([*flags, "--max_steps", "-1"])
    assert (args.max_steps, args.num_train_epochs) == (-1, 2)


def test_the_commands_own_flags_and_the_trainers_may_come_in_any_order(tmp_path):
    _, data_args, _, args = finetune.parse_args(
        ["--max_steps", "7", "--model", "m", "--output_dir", str(tmp_path), "--num_beams", "2", "--dataset_dir", "d"]
    )
    assert (data_args.dataset_dir, args.max_steps, args.generation_num_beams, args.output_dir) == (
        "d",
        7,
        2,
        str(tmp_path),
    )


def test_a_flag_the_script_does_not_name_reaches_the_trainer(workspace, tmp_path):
    """Here Adam's beta2 (0.98 in section 5.3) and the scheduler's kwargs, two Seq2SeqTrainingArguments fields."""
    train = datasets.Dataset.from_dict({"translation": PAIRS[:4]})
    flags = "--use_cpu --adam_beta2 0.98 --lr_scheduler_type cosine_with_min_lr --learning_rate 1e-3 --max_steps 10"
    _, data_args, _, args = finetune.parse_args(
        ["--model", "m", "--dataset_dir", "d", "--output_dir", str(tmp_path), *flags.split()]
        + ["--lr_scheduler_kwargs", '{"min_lr": 1e-6}']
    )
    model = VaswaniForConditionalGeneration.from_pretrained(workspace["model"])
    trainer = finetune.build_trainer(data_args, args, model, workspace["tokenizer"], train, train)
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    assert trainer.optimizer.param_groups[0]["betas"] == (0.9, 0.98)
    for _ in range(args.max_steps):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(1e-6)


TRANSLATE_IN_A_FRESH_PROCESS = """
import sys, json
import vaswani  # registers the model with the Auto classes
from peft import PeftModel
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
base, adapter, *sources = sys.argv[1:]
tokenizer = AutoTokenizer.from_pretrained(adapter)
model = PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(base), adapter).eval()
batch = tokenizer(sources, return_tensors="pt", padding=True)
print(json.dumps(model.generate(**batch, num_beams=4).tolist()))
"""


def test_lora_trains_the_attention_adapters_saves_them_and_merges_to_a_plain_model(workspace, tmp_path):
    """--lora_r: only the adapters of the attention projections train; the adapter saves the Hub way, loads onto the
    model it came from in a fresh process, and merges (--merge) into a plain model, with the same translations at each
    step."""
    output_dir = tmp_path / "lora"
    flags = "--max_steps 10 --learning_rate 5e-3 --per_device_train_batch_size 8 --lora_r 4 --merge".split()
    run_finetune(workspace["model"], workspace["data"], output_dir, *flags)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {path.name for path in output_dir.iterdir()}
    adapter = load_file(str(output_dir / "adapter_model.safetensors"))
    assert adapter and all("lora_" in name for name in adapter)
    assert {name.split(".lora_")[0].rsplit(".", 1)[1] for name in adapter} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "out_proj",
    }
    # The adapters alone train, and the run's record says how many numbers that is.
    trained = json.loads((output_dir / "train_results.json").read_text())["trainable_parameters"]
    assert trained == sum(tensor.numel() for tensor in adapter.values())

    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    sources = ["the dog sings every day", "the bird reads every day"]
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    merged = VaswaniForConditionalGeneration.from_pretrained(output_dir / "merged").eval()
    translations = merged.generate(**batch, num_beams=4).tolist()
    pretrained = VaswaniForConditionalGeneration.from_pretrained(workspace["model"]).eval()
    assert pretrained.generate(**batch, num_beams=4).tolist() != translations, "the adapter changed nothing"
    script = tmp_path / "translate.py"
    script.write_text(TRANSLATE_IN_A_FRESH_PROCESS)
    done = subprocess.run(
        [sys.executable, script, workspace["model"], output_dir, *sources], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == translations


@pytest.mark.parametrize(
    ("flags", "message"),
    [("--merge", "--merge merges a LoRA adapter: give --lora_r too."), ("--lora_r 0", "--lora_r must be a positive")],
    ids=["merge_without_lora", "rank_0"],
)
def test_lora_flags_that_cannot_work_end_with_the_usage(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        finetune.main(["--model", "m", "--dataset_dir", "d", "--output_dir", "o", *flags.split()])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
