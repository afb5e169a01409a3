"""examples/ run as a user runs them: the loop written with the library trains, checkpoints, resumes and averages."""

import sys

import pytest
from helpers import REPO_ROOT, make_dataset, run_command, two_process_launch, word_tokenizer
from transformers import AutoModelForSeq2SeqLM

from vaswani.training.checkpoints import load_checkpoint_weights


@pytest.mark.slow  # a run, its resume and a straight run
def test_the_minimal_loop_trains_resumes_and_averages_its_last_checkpoints(tmp_path):
    data = make_dataset(tmp_path / "data", {"train": 200, "validation": 20})
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    command = [sys.executable, REPO_ROOT / "examples" / "train_minimal.py", data, tokenizer, tmp_path / "run"]
    first = run_command([*command, "--max_steps", 20, "--save_steps", 10], check=True)
    assert "step 20: loss" in first.stdout and "validation" in first.stdout
    resumed = run_command([*command, "--max_steps", 40, "--save_steps", 10], check=True)
    assert "resumed from" in resumed.stdout and "step_0000020: step 20" in resumed.stdout
    assert "final model: the average of step_0000020, step_0000030, step_0000040" in resumed.stdout

    key = "model.shared.weight"
    steps = [
        load_checkpoint_weights(tmp_path / "run" / "checkpoints" / f"step_{step:07d}")[key] for step in (20, 30, 40)
    ]
    final = load_checkpoint_weights(tmp_path / "run" / "final")[key]
    assert ((steps[0] + steps[1] + steps[2]) / 3 - final).abs().max() < 1e-6
    assert (steps[0] - steps[2]).abs().max() > 1e-3  # it trained
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run" / "final").config.d_model == 64


@pytest.mark.slow  # two processes
def test_the_minimal_loop_trains_on_two_processes_as_one_run(tmp_path):
    """`accelerate launch` of the example: the launched strategy (DDP over gloo here), one log and one final model."""
    data = make_dataset(tmp_path / "data", {"train": 200, "validation": 13})
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    script = REPO_ROOT / "examples" / "train_minimal.py"
    result = run_command(
        [*two_process_launch(), script, data, tokenizer, tmp_path / "run", "--max_steps", 20, "--save_steps", 10],
        check=True,
    )
    assert "strategy: data parallel (MULTI_CPU, gloo), 2 processes on cpu" in result.stdout
    assert result.stdout.count("step 20: loss") == 1  # the main process speaks for both
    assert "final model: the average of step_0000010, step_0000020" in result.stdout
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run" / "final").config.d_model == 64
