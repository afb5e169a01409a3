"""scripts/train.py, evaluate_bleu.py and visualize.py end to end, on a tiny synthetic corpus, on the CPU.

The corpus is a word-for-word "translation" between two 16-word vocabularies, so the tiny preset learns it in a few
dozen steps. The scripts run as subprocesses, as a user runs them (including two DDP processes through
`accelerate launch`); the pure functions they expose (schedule, batching, checkpoint averaging) are tested directly.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate.utils import DistributedType
from helpers import (
    FAST,
    FAULTY_TRAIN,
    REPO_ROOT,
    SCRIPTS,
    TINY,
    accelerate_launch,
    exit_message,
    finish,
    free_port,
    make_dataset,
    max_difference,
    read_log,
    run_command,
    run_script,
    save_pairs,
    script_env,
    start,
    train_arguments,
    train_command,
    two_process_launch,
    word_pair,
    word_tokenizer,
)
from safetensors.torch import load_file
from torch.torch_version import TorchVersion
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vaswani.checks import UsageError
from vaswani.evaluation.bleu import corpus_bleu, translate
from vaswani.scripts import train
from vaswani.training.batching import TokenBucketSampler, paper_batch_tokens
from vaswani.training.checkpoints import average_checkpoints, load_checkpoint_weights
from vaswani.training.distributed import LaunchedStrategy
from vaswani.training.schedule import inverse_sqrt_lr, paper_peak_lr, peak_lr_of


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    data = make_dataset(root / "data", {"train": 1200, "validation": 40, "test": 30})
    return data, word_tokenizer(root / "tokenizer")


@pytest.fixture(scope="module")
def training_run(corpus, tmp_path_factory):
    """One single-process run with validation, BLEU, TensorBoard and checkpoint averaging: its output folder, and what
    it printed to its pipes (as a job's log gets it)."""
    data, tokenizer = corpus
    output_dir = tmp_path_factory.mktemp("trained") / "out"
    result = run_script(
        "train",
        *train_arguments(data, tokenizer, output_dir),
        *FAST,
        "--max_steps",
        200,
        "--save_steps",
        20,
        "--save_total_limit",
        3,
        "--average_last",
        3,
        "--eval_steps",
        100,
        "--eval_bleu_samples",
        20,
    )
    return output_dir, result


@pytest.fixture(scope="module")
def trained(training_run):
    return training_run[0]


# The 200-step run's numerics on 2026-12-04, pinned as transformers' integration tests pin expected logits.
PINNED_LOSSES = [3.913085, 3.287074, 3.111068, 3.058221]  # steps 5, 10, 15, 20
PINNED_VALIDATION_LOSS = 0.637418  # the averaged model's
PINNED_TRANSLATION = "pájaro casa grande árbol grande el rojo el"  # of the first test sentence, the paper's decoding


def test_the_recipes_numerics_are_pinned(training_run, corpus):
    """The run's first losses (seed 0, one thread), its averaged model's validation loss and its translation of a
    test sentence are the pinned ones. A change that moves them moves the main job's figures too: its commit says
    why, and the main job's records and the pages that quote them are measured again (docs/testing.md). The
    tolerances take the rounding of another CPU, not a change of the recipe."""
    from datasets import load_from_disk

    output_dir, _ = training_run
    losses = [record["loss"] for record in read_log(output_dir) if "loss" in record][:4]
    assert losses == pytest.approx(PINNED_LOSSES, rel=1e-5)
    summary = json.loads((output_dir / "training_summary.json").read_text())
    assert summary["final_val_loss"] == pytest.approx(PINNED_VALIDATION_LOSS, rel=1e-3)
    source = load_from_disk(str(corpus[0]))["test"][0]["translation"]["en"]
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(output_dir), AutoTokenizer.from_pretrained(output_dir)
    assert translate(model, tokenizer, [source]) == [PINNED_TRANSLATION]


def test_a_log_gets_a_line_per_logging_step_and_no_bar(training_run):
    """Output to a file or a pipe (`vaswani-train ... > log 2>&1`): the figures of each logging step on a line of their
    own, and no bar (the run's or the libraries') redrawn with carriage returns."""
    output_dir, result = training_run
    records = [json.loads(line) for line in (output_dir / "train_log.jsonl").read_text().splitlines()]
    steps = [record for record in records if "loss" in record]
    assert len(steps) == 200 // 5
    for record in steps:
        line = f"step {record['step']}/200: loss {record['loss']:.3f}, lr {record['lr']:.2e}, "
        assert f"\n{line}{record['tokens_per_sec']:,.0f} tokens/s\n" in result.stdout
    assert "\nstep 100: validation loss" in result.stdout
    assert "\r" not in result.stdout + result.stderr


def test_a_bar_updates_live_in_a_terminal_and_every_30_seconds_in_a_log(monkeypatch):
    from vaswani.progress import LOG_INTERVAL, progress_bar

    assert LOG_INTERVAL == 30
    with progress_bar(total=3) as bar:  # pytest's captured stderr: not a terminal
        assert (bar.mininterval, bar.maxinterval) == (30, 30)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress_bar(total=3) as bar:
        assert (bar.mininterval, bar.maxinterval) == (0.1, 10.0)  # tqdm's own


# --- Section 5.3: the learning rate. ---


def test_the_schedule_is_built_without_the_deepspeed_extra():
    """Without DeepSpeed installed (the `train` extra alone, as the main job installs it), accelerate.utils has no
    DummyOptim: the schedule must not ask for it."""
    code = """
import importlib.metadata
metadata = importlib.metadata.metadata
def without_deepspeed(name):
    if name == "deepspeed":
        raise importlib.metadata.PackageNotFoundError(name)
    return metadata(name)
importlib.metadata.metadata = without_deepspeed  # accelerate then finds no DeepSpeed
import torch
from vaswani.training.schedule import inverse_sqrt_schedule
optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
print(type(inverse_sqrt_schedule(optimizer, 10, 1e-3)).__name__)
"""
    assert run_command([sys.executable, "-c", code], check=True).stdout.split() == ["LambdaLR"]


@pytest.mark.parametrize("d_model,warmup", [(512, 4000), (1024, 4000), (256, 130)])
def test_paper_schedule_is_equation_3(d_model, warmup):
    for step in (1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 100_000, 300_000):
        expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert inverse_sqrt_lr(step, warmup, paper_peak_lr(d_model, warmup)) == pytest.approx(expected, rel=1e-12)
        assert inverse_sqrt_lr(step, warmup, paper_peak_lr(d_model, warmup, lr_scale=2.0)) == pytest.approx(
            2 * expected, rel=1e-12
        )
    peak = max(inverse_sqrt_lr(step, warmup, paper_peak_lr(d_model, warmup)) for step in range(1, 3 * warmup))
    assert peak == pytest.approx((d_model * warmup) ** -0.5)  # reached at step == warmup
    assert inverse_sqrt_lr(4000, 4000, paper_peak_lr(512, 4000)) == pytest.approx(6.988e-4, rel=1e-3)


def test_short_schedule_peaks_at_peak_lr_then_decays_as_inverse_square_root():
    warmup, peak = 100, 1e-3
    assert peak_lr_of("short", 256, warmup, peak_lr=peak) == peak
    assert inverse_sqrt_lr(warmup, warmup, peak) == pytest.approx(peak)
    assert inverse_sqrt_lr(warmup // 2, warmup, peak) == pytest.approx(peak / 2)
    assert inverse_sqrt_lr(4 * warmup, warmup, peak) == pytest.approx(peak / 2)
    assert max(inverse_sqrt_lr(s, warmup, peak) for s in range(1, 1000)) == pytest.approx(peak)
    with pytest.raises(ValueError):
        peak_lr_of("cosine", 256, warmup)


def test_the_named_schedules_peak_where_their_flags_say():
    """--lr_schedule paper peaks at (d_model * warmup)^-0.5 times --lr_scale (default 1); short at --peak_lr (default
    1e-3, the main job's)."""
    assert peak_lr_of("paper", 512, 4000) == paper_peak_lr(512, 4000) == pytest.approx(6.988e-4, rel=1e-3)
    assert peak_lr_of("paper", 512, 4000, lr_scale=2.0, peak_lr=5.0) == pytest.approx(2 * 6.988e-4, rel=1e-3)
    assert (
        peak_lr_of("short", 512, 4000) == 1e-3 and peak_lr_of("short", 512, 4000, lr_scale=2.0, peak_lr=5e-4) == 5e-4
    )
    with pytest.raises(
        ValueError, match="unknown learning-rate schedule 'cosine'; choose one of \\('paper', 'short'\\)"
    ):
        peak_lr_of("cosine", 512, 4000)


def test_schedule_steps_count_from_one_as_the_papers_step_num():
    """The scheduler's step k (from 0) trains with the paper's step_num k + 1: the first step does not train at 0."""
    from vaswani.training.schedule import inverse_sqrt_schedule

    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=1.0)
    scheduler = inverse_sqrt_schedule(optimizer, warmup_steps=10, peak_lr=1e-3)
    rates = []
    for _ in range(30):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([inverse_sqrt_lr(step, 10, 1e-3) for step in range(1, 31)], rel=1e-12)
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)


# --- The training script. ---


def test_training_writes_model_logs_plots_and_summary(trained, corpus):
    summary = json.loads((trained / "training_summary.json").read_text())
    assert summary["steps"] == 200 and summary["preset"] == "tiny"
    assert summary["world_size"] == 1 and summary["hardware"]["num_processes"] == 1
    # The kernels torch ran, by which float32 sums round (docs/testing.md).
    assert summary["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert summary["tokens_seen"] > 200 * 300 and summary["tokens_per_sec"] > 0
    assert summary["averaged_checkpoints"] == ["step_0000160", "step_0000180", "step_0000200"]
    assert "nrefs:1" in summary["bleu_signature"] and summary["final_val_bleu"] is not None
    assert "train.py" in summary["command"] and summary["wall_seconds"] > 0
    # Only the last --save_total_limit are kept, each complete.
    checkpoints = sorted(p.name for p in (trained / "checkpoints").iterdir())
    assert checkpoints == summary["averaged_checkpoints"]
    for name in checkpoints:
        assert json.loads((trained / "checkpoints" / name / "train_state.json").read_text())["step"] == int(name[5:])
    # The log a person can plot; the logged learning rate is the schedule's (step counted from 1).
    log = read_log(trained)
    losses = [r for r in log if "loss" in r]
    assert [r["step"] for r in losses] == list(range(5, 201, 5))
    assert losses[-1]["loss"] < losses[0]["loss"] - 1.0
    for record in losses:
        assert record["lr"] == pytest.approx(inverse_sqrt_lr(record["step"], 20, 3e-3))
    evaluations = [r for r in log if "val_loss" in r and not r.get("final")]
    assert [r["step"] for r in evaluations] == [100, 200] and all("bleu" in r for r in evaluations)
    assert evaluations[1]["val_loss"] < evaluations[0]["val_loss"]
    assert log[-1]["final"] and log[-1]["val_loss"] < 1.5  # far below the uniform 3.6 nats over 36 tokens
    # Plots and TensorBoard events.
    for png in ("training_curves.png", "lr_schedule.png"):
        assert (trained / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((trained / "logs").rglob("events.out.tfevents.*"))
    # The output folder is a model and a tokenizer the Auto classes load.
    tokenizer = AutoTokenizer.from_pretrained(trained)
    model = AutoModelForSeq2SeqLM.from_pretrained(trained)
    assert model.config.vocab_size == len(tokenizer) == len(AutoTokenizer.from_pretrained(corpus[1]))
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6


@pytest.mark.slow  # two training runs, one compiled by torch.compile: a minute and a half on 2 cores
def test_a_compiled_run_takes_the_eager_runs_steps_and_saves_plain_weights(corpus, tmp_path):
    """--torch_compile (the default on a GPU): the same losses as eager, its compile time in the log, checkpoints
    and the final model without torch.compile's wrapper in their names, loadable by the Auto classes."""
    data, tokenizer = corpus
    no_dropout = ["--config_overrides", "dropout=0.0,attention_dropout=0.0,activation_dropout=0.0"]
    flags = [*FAST, *no_dropout, "--max_steps", 4, "--save_steps", 2, "--average_last", 2, "--logging_steps", 1]
    flags += ["--eval_steps", 4, "--eval_bleu_samples", 4, "--report_to", "none"]
    runs = {}
    for compiled in (True, False):
        output_dir = tmp_path / str(compiled)
        result = run_script(
            "train", *train_arguments(data, tokenizer, output_dir, *flags, "--torch_compile", compiled)
        )
        runs[compiled] = output_dir, result.stdout
    (compiled_dir, compiled_out), (eager_dir, eager_out) = runs[True], runs[False]
    assert "torch.compile: the first step, compiling the model, took" in compiled_out
    assert "torch.compile on" in compiled_out and "torch.compile off" in eager_out
    assert "torch.compile: the first step" not in eager_out
    losses = {run: [r["loss"] for r in read_log(runs[run][0]) if "loss" in r] for run in runs}
    assert len(losses[True]) == 4 and losses[True] == pytest.approx(losses[False], rel=1e-4)
    for name in ("checkpoints/step_0000004/model.safetensors", "model.safetensors"):
        weights = load_file(str(compiled_dir / name))
        assert weights.keys() == load_file(str(eager_dir / name)).keys(), name
    assert AutoModelForSeq2SeqLM.from_pretrained(compiled_dir).config.d_model == 64


def test_the_default_batch_makes_the_papers_step_over_the_processes(corpus, tmp_path):
    """Section 5.1's ~25,000 + 25,000 tokens a step: one batch of 50,000 on one process, 6,250 on each of 8, halved
    again when two batches are accumulated; vaswani-train takes it when --batch_tokens is not given."""
    assert [paper_batch_tokens(1), paper_batch_tokens(8), paper_batch_tokens(8, 2)] == [50000, 6250, 3125]
    data, tokenizer = corpus
    flags = [*TINY, "--warmup_steps", 1, "--max_steps", 1, "--eval_steps", 1, "--eval_bleu_samples", 0]
    flags += ["--gradient_accumulation_steps", 2, "--average_last", 1, "--report_to", "none"]
    result = run_script("train", *train_arguments(data, tokenizer, tmp_path / "out", *flags))
    assert "batches of <= 25000 padded tokens x 2 accumulated x 1 processes = <= 50000 tokens" in result.stdout


def test_the_model_compiles_by_default_on_an_accelerator_only():
    assert LaunchedStrategy(fsdp=False, deepspeed=False, on_cpu=False).compiles(None)
    assert not LaunchedStrategy(fsdp=False, deepspeed=False, on_cpu=True).compiles(None)
    assert not LaunchedStrategy(fsdp=False, deepspeed=False, on_cpu=False).compiles(False)
    assert LaunchedStrategy(fsdp=False, deepspeed=False, on_cpu=True).compiles(True)


def tokenized_files(data):
    return sorted(path.name for path in Path(data).glob("*/vaswani-tokens-*"))


@pytest.mark.slow  # two processes
def test_two_ddp_processes_train_together_from_one_tokenization_and_end_identical(corpus, tmp_path):
    tokenizer = corpus[1]
    data = make_dataset(tmp_path / "data", {"train": 1200, "validation": 40})  # not tokenized yet
    output_dir = tmp_path / "ddp"
    flags = "--batch_tokens 300 --max_steps 30 --save_steps 15 --eval_steps 0 --eval_bleu_samples 6 --report_to none"
    arguments = train_arguments(data, tokenizer, output_dir, *FAST, *flags.split())
    result = run_command([*two_process_launch(), SCRIPTS / "train.py", *arguments], timeout=600, check=True)
    assert "tokenized now and cached next to the dataset" in result.stdout
    summary = json.loads((output_dir / "training_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["hardware"]["distributed_type"] == "MULTI_CPU"
    ranks = summary["processes"]
    assert [r["rank"] for r in ranks] == [0, 1]
    # The main process tokenized; the other one mapped the files it wrote (2 tokenized shards and the counts of
    # each split: one tokenization each).
    assert [r["tokenized"] for r in ranks] == [True, False]
    assert len(tokenized_files(data)) == 6
    assert ranks[0]["trained"] == ranks[1]["trained"] and ranks[0]["averaged"] == ranks[1]["averaged"]
    assert ranks[0]["trained"] != ranks[0]["averaged"]  # the average of steps 15 and 30 is another model
    # Each process saved its own random states; a step holds batches of both.
    checkpoint = output_dir / "checkpoints" / "step_0000030"
    assert (checkpoint / "random_states_0.pkl").is_file() and (checkpoint / "random_states_1.pkl").is_file()
    losses = [r for r in read_log(output_dir) if "loss" in r]
    assert losses[0]["tokens_per_step"] > 300  # two processes' batches of <= 300 tokens each
    assert losses[-1]["loss"] < losses[0]["loss"] - 0.5


@pytest.mark.slow  # two launches of two processes
def test_two_machines_on_the_loopback_train_from_one_cache_and_end_identical(corpus, tmp_path):
    """configs/multi_node.yaml as a user runs it on two machines, here two launchers on 127.0.0.1 with one gloo
    process each, sharing a file system: machine 0 tokenizes, machine 1 maps its files, both end with one model."""
    tokenizer = corpus[1]
    data = make_dataset(tmp_path / "data", {"train": 600, "validation": 20})
    output_dir, port = tmp_path / "out", free_port()
    flags = "--batch_tokens 300 --max_steps 12 --save_steps 6 --eval_steps 0 --eval_bleu_samples 0 --report_to none"
    arguments = train_arguments(data, tokenizer, output_dir, *FAST, *flags.split())
    machines = []
    for rank in (0, 1):
        launcher = accelerate_launch(
            "--config_file", REPO_ROOT / "configs" / "multi_node.yaml", "--num_machines", 2, "--num_processes", 2,
            "--machine_rank", rank, "--main_process_ip", "127.0.0.1", "--mixed_precision", "no",
            "--dynamo_backend", "no", port=port,
        )  # fmt: skip
        machines.append(start([*launcher, SCRIPTS / "train.py", *arguments]))
    outputs = finish(*machines, timeout=300)
    assert [machine.returncode for machine in machines] == [0, 0], "\n\n".join(
        f"{stdout[-3000:]}\n{stderr[-3000:]}" for stdout, stderr in outputs
    )
    summary = json.loads((output_dir / "training_summary.json").read_text())
    assert summary["world_size"] == 2
    ranks = summary["processes"]
    assert [(r["rank"], r["tokenized"]) for r in ranks] == [(0, True), (1, False)]
    assert ranks[0]["trained"] == ranks[1]["trained"] and ranks[0]["averaged"] == ranks[1]["averaged"]
    assert len(tokenized_files(data)) == 6


@pytest.mark.slow  # three training runs; test_reliability's SIGTERM test resumes exactly by default
def test_resumed_run_ends_exactly_like_an_uninterrupted_one(corpus, tmp_path):
    """Dropout on, gradient accumulation, an epoch boundary after the restart: same weights to the last bit."""
    data, tokenizer = corpus
    # 1500-token batches, 2 per step: 6 steps per epoch, so the restart is mid-epoch and an epoch ends after it.
    common = [
        "--dataset_dir",
        data,
        "--tokenizer",
        tokenizer,
        *FAST,
        "--batch_tokens",
        1500,
        "--gradient_accumulation_steps",
        2,
        "--max_steps",
        8,
        "--save_steps",
        4,
        "--average_last",
        2,
        "--eval_steps",
        3,
        "--eval_bleu_samples",
        4,
        "--logging_steps",
        2,
        "--report_to",
        "none",
    ]
    run_script("train", *common, "--output_dir", tmp_path / "straight")
    run_script("train", *common, "--output_dir", tmp_path / "stopped", "--stop_after", 4)
    stopped = tmp_path / "stopped" / "checkpoints"
    assert sorted(p.name for p in stopped.iterdir()) == ["step_0000004"]
    assert not (tmp_path / "stopped" / "model.safetensors").exists()  # stopped as if killed: no final model
    # What a kill during a save would leave behind: neither may be taken for the latest checkpoint.
    (stopped / "tmp_step_0000006").mkdir()
    (stopped / "step_0000007").mkdir()
    # Resumed with the batches read and padded in two worker processes: the same batches, the same weights.
    result = run_script(
        "train",
        *common,
        "--output_dir",
        tmp_path / "stopped",
        "--resume_from_checkpoint",
        "--dataloader_num_workers",
        2,
    )
    assert "resumed from" in result.stdout and "step_0000004" in result.stdout
    assert "tokenized earlier, read from the cache" in result.stdout  # the corpus is tokenized once, not per run
    at_stop = json.loads((stopped / "step_0000004" / "train_state.json").read_text())
    assert (at_stop["step"], at_stop["epoch"], at_stop["batch_index"]) == (4, 0, 8)
    assert json.loads((stopped / "step_0000008" / "train_state.json").read_text())["epoch"] == 1
    for name in ("checkpoints/step_0000008/model.safetensors", "model.safetensors"):
        straight = load_file(str(tmp_path / "straight" / name))
        resumed = load_file(str(tmp_path / "stopped" / name))
        assert max_difference(straight, resumed) <= 1e-6, name
    straight_log = [r for r in read_log(tmp_path / "straight") if "loss" in r]
    resumed_log = [r for r in read_log(tmp_path / "stopped") if "loss" in r]
    assert [r["step"] for r in resumed_log] == [r["step"] for r in straight_log]  # no duplicated lines
    assert [r["loss"] for r in resumed_log] == pytest.approx([r["loss"] for r in straight_log], abs=1e-6)
    # The resumed run's summary is the whole run's, as the uninterrupted run's is, not that of its last 4 steps.
    straight, resumed = (
        json.loads((tmp_path / run / "training_summary.json").read_text()) for run in ("straight", "stopped")
    )
    for key in ("steps", "tokens_seen", "target_tokens_seen", "averaged_checkpoints", "skipped_steps"):
        assert resumed[key] == straight[key], key
    assert resumed["final_val_loss"] == pytest.approx(straight["final_val_loss"], abs=1e-6)


@pytest.mark.slow  # three training runs, one of two processes
def test_a_step_has_the_token_normalised_gradient_however_its_tokens_are_split(corpus, tmp_path):
    """Section 5.1's batches are counted in tokens: a step's loss is the sum over all its target tokens divided by
    their number, whether the tokens come as one batch, as two accumulated micro-batches, or from two DDP processes,
    here with 4 short pairs in one micro-batch and 2 long ones in the other (unequal token counts)."""
    words = [["the", "red", "cat"]] * 4 + [["the", "big", "green", "bird", "sees", "a", "small", "red", "dog"]] * 2
    save_pairs(tmp_path / "data", [word_pair(" ".join(w)) for w in words])
    # Token buckets of 40 padded tokens cut the 6 pairs (8 and 20 tokens a pair) into 4 short and 2 long; 1000, none.
    sampler = TokenBucketSampler(np.array([4] * 4 + [10] * 2), np.array([4] * 4 + [10] * 2), 40, shuffle=False)
    assert sorted(len(batch) for batch in sampler) == [2, 4]
    common = ["--dataset_dir", tmp_path / "data", "--tokenizer", corpus[1], "--preset", "tiny", "--dropout", 0,
              "--max_steps", 1, "--save_steps", 1, "--average_last", 1, "--eval_steps", 0,
              "--eval_bleu_samples", 0, "--report_to", "none"]  # fmt: skip
    gradients = {}
    for name, batch_tokens, launch, accumulate in (
        ("one batch", 1000, [], 1),
        ("two accumulated micro-batches", 40, [], 2),
        ("two DDP processes", 40, two_process_launch(), 1),
    ):
        arguments = [*common, "--batch_tokens", batch_tokens, "--gradient_accumulation_steps", accumulate,
                     "--output_dir", tmp_path / name]  # fmt: skip
        if launch:
            command = [*launch, FAULTY_TRAIN, "first-gradients", *arguments]
        else:
            command = train_command(*arguments, fault="first-gradients")
        done = run_command(command, env=script_env(GRADIENTS=str(tmp_path / f"{name}.pt")))
        assert done.returncode == 0, f"{name}:\n{done.stderr[-3000:]}"
        gradients[name] = torch.load(tmp_path / f"{name}.pt")
    reference = gradients["one batch"]
    assert max(gradient.abs().max().item() for gradient in reference) > 1e-3
    for name, measured in gradients.items():
        for expected, got in zip(reference, measured, strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.slow  # three training runs
def test_long_pairs_are_dropped_or_truncated_and_counted(corpus, tmp_path):
    """--long_pairs: training pairs longer than --max_source_length/--max_target_length (with </s>) are left out
    (filter) or cut to the limits (truncate), and the run says how many; validation pairs are always truncated."""
    short, long = "the red cat", "the big green bird sees a small red dog"  # 4 and 10 tokens with </s>
    save_pairs(tmp_path / "data", [word_pair(e) for e in [short] * 6 + [long] * 3])
    for long_pairs, kept, dropped, truncated in (("filter", 6, 3, 0), ("truncate", 9, 0, 3)):
        output_dir = tmp_path / long_pairs
        result = run_script(
            "train", "--dataset_dir", tmp_path / "data", "--tokenizer", corpus[1], "--output_dir", output_dir,
            "--preset", "tiny", "--max_source_length", 6, "--max_target_length", 6, "--long_pairs", long_pairs,
            "--batch_tokens", 100, "--max_steps", 2, "--save_steps", 2, "--average_last", 1, "--eval_steps", 0,
            "--eval_bleu_samples", 0, "--report_to", "none",
        )  # fmt: skip
        assert (
            f"train: {kept} pairs ({dropped} longer than the maximum lengths dropped, {truncated} truncated"
            in result.stdout
        )
        summary = json.loads((output_dir / "training_summary.json").read_text())
        assert (summary["train_pairs"], summary["train_pairs_dropped"], summary["train_pairs_truncated"]) == (
            kept, dropped, truncated,
        )  # fmt: skip


@pytest.mark.slow  # a 200-step training run
def test_model_overfits_a_handful_of_pairs(tmp_path):
    pairs = ["the red cat sees a dog", "a big bird eats", "the small house has a green tree", "dog likes blue"]
    records = [word_pair(e) for e in pairs]
    save_pairs(tmp_path / "data", records, id=[str(i) for i in range(4)])
    tokenizer_dir = word_tokenizer(tmp_path / "tokenizer")
    output_dir = tmp_path / "out"
    run_script(
        "train",
        "--dataset_dir",
        tmp_path / "data",
        "--tokenizer",
        tokenizer_dir,
        "--output_dir",
        output_dir,
        *TINY,
        "--dropout",
        0,
        "--label_smoothing_factor",
        0,
        "--warmup_steps",
        20,
        "--max_steps",
        200,
        "--batch_tokens",
        200,
        "--save_steps",
        200,
        "--average_last",
        1,
        "--eval_steps",
        0,
        "--eval_bleu_samples",
        4,
        "--logging_steps",
        20,
        "--report_to",
        "none",
    )
    final_loss = [r for r in read_log(output_dir) if "loss" in r][-1]["loss"]
    assert final_loss < 0.05
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert translate(model, tokenizer, pairs, num_beams=1) == [r["es"] for r in records]
    assert json.loads((output_dir / "training_summary.json").read_text())["final_val_bleu"] == pytest.approx(100.0)


# --- Section 6.1: checkpoint averaging. ---


def test_averaging_identical_checkpoints_is_the_identity(trained):
    checkpoint = trained / "checkpoints" / "step_0000200"
    weights = load_checkpoint_weights(checkpoint)
    averaged = average_checkpoints([checkpoint] * 3)
    assert max_difference(weights, averaged) == 0.0
    assert all(averaged[key].dtype == weights[key].dtype for key in weights)


def test_averaging_is_the_elementwise_mean_and_gives_the_saved_model(trained):
    paths = [trained / "checkpoints" / name for name in ("step_0000160", "step_0000180", "step_0000200")]
    weights = [load_checkpoint_weights(path) for path in paths]
    averaged = average_checkpoints(paths)
    mean = {key: sum(w[key].double() for w in weights) / 3 for key in weights[0]}
    assert max_difference(averaged, mean) < 1e-6
    assert max_difference(averaged, weights[-1]) > 1e-4  # really a different model than the last checkpoint
    # The folder written at the end holds exactly this average, loads with the Auto class and translates.
    model = AutoModelForSeq2SeqLM.from_pretrained(trained)
    state = model.state_dict()
    assert max_difference({key: state[key] for key in averaged}, averaged) < 1e-6
    assert torch.equal(model.lm_head.weight, state["model.shared.weight"])  # still tied (section 3.4)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    translations = translate(model, tokenizer, ["the red cat", "a dog sees the tree"], num_beams=2)
    assert len(translations) == 2 and all(isinstance(t, str) and t for t in translations)


def test_averaging_is_the_float64_mean_in_each_tensors_dtype_and_checks_every_tensor(tmp_path):
    """average_checkpoints on hand-made files: no training run, so mutation testing can run it for every mutant."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    shapes = {"a": (3, 4), "b": (5,), "c": (2, 2)}
    dtypes = {"a": torch.float32, "b": torch.bfloat16, "c": torch.float16}
    checkpoints = []
    for index in range(3):
        weights = {key: torch.randn(shape, generator=generator).to(dtypes[key]) for key, shape in shapes.items()}
        folder = tmp_path / f"step_{index}"
        folder.mkdir()
        # DDP's prefix on one checkpoint only: it is removed when reading, so all three hold the same names.
        save_file(
            {("module." if index == 1 else "") + key: t for key, t in weights.items()},
            str(folder / "model.safetensors"),
        )
        checkpoints.append((folder, weights))
    averaged = average_checkpoints(folder for folder, _ in checkpoints)
    assert averaged.keys() == shapes.keys()
    for key in shapes:
        mean = sum(weights[key].double() for _, weights in checkpoints) / 3
        assert averaged[key].dtype == dtypes[key]
        assert torch.equal(averaged[key], mean.to(dtypes[key]))  # one rounding, from float64
    assert torch.equal(average_checkpoints([checkpoints[0][0] / "model.safetensors"])["a"], checkpoints[0][1]["a"])

    save_file(
        {"a": torch.zeros(3, 4), "b": torch.zeros(5), "c": torch.zeros(2, 3)}, str(tmp_path / "wide.safetensors")
    )
    with pytest.raises(ValueError, match=r"c has shape \(2, 3\) in .*wide.safetensors but \(2, 2\) in .*step_0$"):
        average_checkpoints([checkpoints[0][0], tmp_path / "wide.safetensors"])
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "fewer.safetensors"))
    with pytest.raises(ValueError, match=r"fewer.safetensors holds different tensors than .*step_0: \['c'\]"):
        average_checkpoints([checkpoints[0][0], tmp_path / "fewer.safetensors"])
    extra = {f"extra{i}": torch.zeros(1) for i in range(7)}
    save_file({**checkpoints[0][1], **extra}, str(tmp_path / "more.safetensors"))
    with pytest.raises(ValueError, match=r"\['extra0', 'extra1', 'extra2', 'extra3', 'extra4'\]$"):  # the first 5
        average_checkpoints([checkpoints[0][0], tmp_path / "more.safetensors"])
    with pytest.raises(ValueError, match="^average_checkpoints needs at least one checkpoint$"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError, match="no model.safetensors in checkpoint"):
        average_checkpoints([tmp_path])


def test_averaging_refuses_checkpoints_of_different_models(trained, tmp_path):
    from safetensors.torch import save_file

    weights = load_checkpoint_weights(trained / "checkpoints" / "step_0000200")
    save_file(
        {key: tensor for key, tensor in weights.items() if "layers.1." not in key}, str(tmp_path / "a.safetensors")
    )
    with pytest.raises(ValueError, match="different tensors"):
        average_checkpoints([trained / "checkpoints" / "step_0000200", tmp_path / "a.safetensors"])
    with pytest.raises(ValueError):
        average_checkpoints([])


# --- Errors before training starts. ---


def test_clear_errors_before_training(corpus, trained, tmp_path):
    data, tokenizer = corpus
    base = ["--tokenizer", str(tokenizer), "--preset", "tiny", "--max_steps", "1"]

    def error_of(*arguments):
        return exit_message(train.main, [*base, *arguments])

    assert "does not exist" in error_of("--dataset_dir", tmp_path / "nowhere", "--output_dir", tmp_path / "o1")
    make_dataset(tmp_path / "no_validation", {"train": 1})
    assert "no 'validation' split" in error_of(
        "--dataset_dir", tmp_path / "no_validation", "--output_dir", tmp_path / "o2"
    )
    assert "language 'de'" in error_of("--dataset_dir", data, "--target_lang", "de", "--output_dir", tmp_path / "o3")
    (tmp_path / "a_file").write_text("")
    assert "cannot write to --output_dir" in error_of("--dataset_dir", data, "--output_dir", tmp_path / "a_file" / "x")
    assert "already holds checkpoints" in error_of("--dataset_dir", data, "--output_dir", trained)
    # Resuming with a tokenizer whose vocabulary is not the checkpoint's.
    other_tokenizer = word_tokenizer(tmp_path / "bigger_tokenizer", extra_words=["perro2", "gato2"])
    resume_dir = tmp_path / "resume"
    (resume_dir / "checkpoints").mkdir(parents=True)
    source = trained / "checkpoints" / "step_0000200"
    (resume_dir / "checkpoints" / source.name).mkdir()
    for file in ("config.json", "train_state.json"):
        (resume_dir / "checkpoints" / source.name / file).write_text((source / file).read_text())
    with pytest.raises(SystemExit, match="the tokenizer has 38 tokens but the vocabulary of checkpoint .* only 36"):
        train.main(
            [
                "--dataset_dir",
                str(data),
                "--tokenizer",
                str(other_tokenizer),
                "--preset",
                "tiny",
                "--output_dir",
                str(resume_dir),
                "--resume_from_checkpoint",
            ]
        )
    # Batches smaller than a pair (found once the corpus is tokenized, in every process alike).
    result = run_command(
        train_command("--dataset_dir", data, *base, "--batch_tokens", 10, "--output_dir", tmp_path / "o5")
    )
    assert (
        result.returncode == 1
        and "train.py: error: --batch_tokens 10, training split: the batch size of 10 "
        "tokens is smaller than the longest pair"
        in result.stderr
    )
    # A tokenizer that does not end sequences with </s>.
    word_tokenizer(tmp_path / "no_eos", words=["a"], bare=True)
    with pytest.raises(SystemExit, match="does not end sequences with </s>"):
        train.main(
            [
                "--dataset_dir",
                str(data),
                "--tokenizer",
                str(tmp_path / "no_eos"),
                "--preset",
                "tiny",
                "--output_dir",
                str(tmp_path / "o4"),
            ]
        )


# --- scripts/evaluate_bleu.py and scripts/visualize.py. ---


def test_corpus_bleu_is_sacrebleu():
    score, signature = corpus_bleu(["el gato rojo ve un perro"], ["el gato rojo ve un perro"])
    assert score.score == pytest.approx(100.0) and signature.startswith("nrefs:1|case:mixed")
    score, _ = corpus_bleu(["el gato"], ["un perro grande come"])
    assert score.score < 5.0
    with pytest.raises(ValueError):
        corpus_bleu(["a"], ["a", "b"])


def test_evaluate_prints_bleu_with_signature_and_writes_hypotheses(trained, corpus, tmp_path):
    output = tmp_path / "hypotheses.txt"
    result = run_script(
        "evaluate_bleu",
        "--model",
        trained,
        "--dataset_dir",
        corpus[0],
        "--split",
        "test",
        "--num_beams",
        2,
        "--max_samples",
        12,
        "--batch_size",
        5,
        "--output",
        output,
    )
    assert "BLEU = " in result.stdout
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in result.stdout
    assert "SRC: " in result.stdout and "HYP: " in result.stdout
    hypotheses = output.read_text().splitlines()
    assert len(hypotheses) == 12 and sum(bool(h) for h in hypotheses) >= 10
    bleu = float(result.stdout.split("BLEU = ")[1].split()[0])
    assert bleu > 10.0  # a trained model, not noise: the tiny corpus is a word-for-word mapping
    # The paper's measure beside it, labelled, and recorded with the decoding that produced it.
    paper_line = next(
        line for line in result.stdout.splitlines() if line.startswith("Tokenized BLEU, compounds split")
    )
    recorded = json.loads((trained / "partial_eval_results.json").read_text())["test.first12"]  # 12 of 30 pairs
    assert float(paper_line.split("BLEU = ")[1].split()[0]) == pytest.approx(recorded["tokenized_bleu"], abs=0.01)
    assert (
        recorded["paper_decoding"] is True
        and recorded["dtype"] == "float32"
        and "float32 on cpu, 1 process)" in result.stdout
    )
    chrf_line = next(line for line in result.stdout.splitlines() if line.startswith("chrF2 = "))
    assert chrf_line == f"chrF2 = {recorded['chrf']:.2f} (sacreBLEU signature: {recorded['chrf_signature']})"
    assert 0 < recorded["chrf"] < 100 and "|nc:6|nw:0|" in recorded["chrf_signature"]


@pytest.mark.slow  # a training run, then the pictures
def test_visualize_writes_positional_encoding_and_attention_pngs(trained, tmp_path):
    import matplotlib.image

    result = run_script(
        "visualize",
        "--model",
        trained,
        "--text",
        "the red cat sees a dog",
        "--output_dir",
        tmp_path / "figures",
        "--num_positions",
        50,
    )
    assert "greedy translation" in result.stdout
    names = ["positional_encoding", "attention_encoder_self", "attention_decoder_self", "attention_encoder_decoder"]
    for name in names:
        image = matplotlib.image.imread(tmp_path / "figures" / f"{name}.png")
        assert image.shape[0] > 200 and image.shape[1] > 200, name
    image = matplotlib.image.imread(tmp_path / "figures" / "attention_encoder_decoder.png")
    assert image.shape[1] > image.shape[0]  # a grid of 2 layers x 4 heads


def test_train_state_reads_the_checkpoints_of_earlier_versions(tmp_path):
    """train_state.json as the code before vaswani.training wrote it (a dict with the settings, the log window and
    the interim mark), and as the code before the settings were recorded wrote it (the process count alone)."""
    from vaswani.training.checkpoints import TrainState

    window = {"loss": 9.5, "nll": 8.0, "target_tokens": 3, "tokens": 7, "seconds": 0.5, "steps": 1, "skipped": 0}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train_state.json").write_text(
        json.dumps({"step": 12, "epoch": 1, "batch_index": 4, "tokens_seen": 900, "target_tokens_seen": 400,
                    "train_seconds": 3.5, "skipped_steps": 1, "bad_streak": 0, "good_weights_step": 11,
                    "settings": {"seed": 0, "num_processes": 2}, "log_window": window, "interim": True})
    )  # fmt: skip
    state = TrainState.read(tmp_path / "a")
    assert (state.step, state.epoch, state.batch_index, state.good_weights_step) == (12, 1, 4, 11)
    assert state.settings == {"seed": 0, "num_processes": 2} and state.log_window == window
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "train_state.json").write_text(json.dumps({"step": 6, "epoch": 0, "batch_index": 6,
                                                                  "num_processes": 1}))  # fmt: skip
    state = TrainState.read(tmp_path / "b")
    assert state.step == 6 and state.settings == {"num_processes": 1} and state.log_window["steps"] == 0


@pytest.mark.parametrize(("version", "refused"), [("2.11.0", True), ("2.13.0", False)])
def test_fsdp_with_a_torch_whose_fsdp2_fails_the_recipe_is_refused_naming_both_versions(monkeypatch, version, refused):
    """torch 2.11's FSDP2 fails at the training step after the first validation: train.py stops at its start instead,
    saying which torch it needs. accelerate sets FSDP up on GPUs only, so the Accelerator is one that reports it."""
    monkeypatch.setattr(torch, "__version__", TorchVersion(version))
    fsdp_accelerator = SimpleNamespace(distributed_type=DistributedType.FSDP, device=torch.device("cuda", 0))
    strategy = LaunchedStrategy(fsdp=True, deepspeed=False, on_cpu=False)
    if not refused:
        strategy.check(fsdp_accelerator)
        return
    with pytest.raises(UsageError, match=r"^FSDP training needs torch 2\.13 or newer; this is torch 2\.11\.0\."):
        strategy.check(fsdp_accelerator)
