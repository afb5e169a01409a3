"""Faults and bad input (docs/reliability.md): a fault loses at most the steps since the last checkpoint, and bad
input gets one clear error before any time is spent.

scripts/train.py runs as a subprocess, as a person or a cluster runs it, and is signalled or killed there. The faults
that cannot be caused from outside (a full disk, a NaN at a chosen step, a kill halfway through a checkpoint file)
are injected through the command's callbacks by tests/train_with_faults.py (`train_command(..., fault=...)`), with
accelerate's save-state hooks and torch's module hooks. Errors raised before training starts are checked in-process.
"""

import json
import os
import re
import shlex
import shutil
import signal
import sys
import time
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from accelerate.utils import DistributedType
from helpers import (
    FAULTY_TRAIN,
    SCRIPTS,
    TINY,
    exit_message,
    finish,
    make_dataset,
    max_difference,
    read_log,
    run_command,
    save_pairs,
    start,
    train_arguments,
    train_command,
    two_process_launch,
    word_tokenizer,
)
from safetensors.torch import load_file

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.checks import UsageError
from vaswani.corpora.dataset import prepare_translation_dataset
from vaswani.corpora.tokenizer import load_tokenizer
from vaswani.evaluation.bleu import load_pairs
from vaswani.scripts import evaluate_bleu, prepare_data, train, train_tokenizer
from vaswani.training.checkpoints import (
    TRAIN_STATE_FILE,
    TrainState,
    is_interim,
    list_checkpoints,
    remove_checkpoint,
    save_checkpoint,
)
from vaswani.training.data import load_translation_dataset
from vaswani.training.faults import StopSignal, check_free_space, resume_command


# 30 steps of the tiny preset, checkpoints every 6 (the last 2 kept and averaged), dropout on, several epochs.
RUN = [
    *TINY,
    "--warmup_steps",
    "5",
    "--batch_tokens",
    "800",
    "--max_steps",
    "30",
    "--save_steps",
    "6",
    "--save_total_limit",
    "2",
    "--average_last",
    "2",
    "--eval_steps",
    "0",
    "--eval_bleu_samples",
    "0",
    "--logging_steps",
    "4",
    "--report_to",
    "none",
]


def wait_for(condition, process, what, timeout=180):
    """Poll until `condition()` holds; fail with the process's output if it ends first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            stdout, stderr = finish(process)
            pytest.fail(
                f"the run ended (code {process.returncode}) before {what}:\n{stdout[-2000:]}\n{stderr[-3000:]}"
            )
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def logged_step(output_dir):
    """The last step in train_log.jsonl (0 if none yet)."""
    try:
        lines = (Path(output_dir) / "train_log.jsonl").read_text().splitlines()
        return max((json.loads(line)["step"] for line in lines if line.strip()), default=0)
    except (OSError, ValueError):  # not written yet, or a line being written
        return 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    return make_dataset(root / "data", {"train": 300, "validation": 12}), word_tokenizer(root / "tokenizer")


def arguments_for(corpus, output_dir, *extra):
    return train_arguments(*corpus, output_dir, *RUN, *extra)


@pytest.fixture(scope="module")
def straight(corpus, tmp_path_factory):
    """The uninterrupted run every interrupted one must end like."""
    output_dir = tmp_path_factory.mktemp("straight") / "out"
    result = run_command(train_command(*arguments_for(corpus, output_dir)))
    assert result.returncode == 0, result.stderr[-3000:]
    return output_dir


def assert_ends_like(straight, resumed):
    """Same checkpoints, same weights in them and in the averaged final model, same training log."""
    names = sorted(path.name for path in (straight / "checkpoints").iterdir())
    assert sorted(path.name for path in (resumed / "checkpoints").iterdir()) == names  # no interim or tmp_ left
    for name in (
        f"checkpoints/{names[-1]}/model.safetensors",
        f"checkpoints/{names[0]}/model.safetensors",
        "model.safetensors",
    ):
        assert max_difference(load_file(str(straight / name)), load_file(str(resumed / name))) == 0.0, name
    expected = [record for record in read_log(straight) if "loss" in record]
    logged = [record for record in read_log(resumed) if "loss" in record]
    assert [record["step"] for record in logged] == [record["step"] for record in expected]
    assert [record["loss"] for record in logged] == pytest.approx([record["loss"] for record in expected], abs=1e-6)


# --- 1. SIGTERM / SIGINT: finish the step, checkpoint, exit, resume exactly. ---


@pytest.mark.slow  # an interrupted run, its resume and a straight run to compare: a minute
def test_sigterm_checkpoints_the_step_under_way_and_the_printed_command_resumes_exactly(corpus, straight, tmp_path):
    output_dir = tmp_path / "out"
    process = start(train_command(*arguments_for(corpus, output_dir)))
    wait_for(lambda: logged_step(output_dir) >= 4, process, "step 4")
    process.send_signal(signal.SIGTERM)
    _, stderr = finish(process)
    assert process.returncode == 143, stderr[-3000:]
    message = re.search(
        r"SIGTERM received: stopped after step (\d+) of 30, checkpoint in (\S+)\. Continue with:\n"
        r"  (.+)\n",
        stderr,
    )
    assert message, stderr[-3000:]
    step, checkpoint = int(message[1]), Path(message[2])
    assert 4 <= step < 30 and checkpoint == output_dir / "checkpoints" / f"step_{step:07d}"
    state = json.loads((checkpoint / "train_state.json").read_text())
    assert state["step"] == step and state["interim"] == (step % 6 != 0)
    assert not (output_dir / "model.safetensors").exists()  # stopped before the end: no final model

    resumed = run_command(shlex.split(message[3]))  # exactly the command the message gives
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {checkpoint}: step {step}" in resumed.stdout
    assert_ends_like(straight, output_dir)


@pytest.mark.slow  # SIGTERM's twin, tested by default
def test_sigint_also_checkpoints_and_exits_130(corpus, tmp_path):
    output_dir = tmp_path / "out"
    process = start(train_command(*arguments_for(corpus, output_dir)))
    wait_for(lambda: logged_step(output_dir) >= 4, process, "step 4")
    process.send_signal(signal.SIGINT)
    _, stderr = finish(process)
    assert process.returncode == 130, stderr[-3000:]
    step = int(re.search(r"SIGINT received: stopped after step (\d+)", stderr)[1])
    assert list_checkpoints(output_dir / "checkpoints")[-1].name == f"step_{step:07d}"
    assert "Traceback" not in stderr


def test_a_second_ctrl_c_stops_at_once_and_the_handlers_are_given_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs between two bytecodes; it only records
        assert stop.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_the_resume_command_repeats_the_arguments_with_resume_once(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(SCRIPTS / "train.py")])
    for given in (
        [],
        ["--resume_from_checkpoint"],
        ["--resume_from_checkpoint", "o/checkpoints/step_0000006"],
        ["--resume_from_checkpoint=o/step_0000006"],
    ):
        command = resume_command(["--output_dir", "o", *given, "--max_steps", "9"])
        python, script, *arguments = shlex.split(command)
        assert (python, Path(script).resolve()) == (sys.executable, SCRIPTS / "train.py")
        assert arguments == ["--output_dir", "o", "--max_steps", "9", "--resume_from_checkpoint"]
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/vaswani-train"])  # the console entry point
    assert shlex.split(resume_command(["--output_dir", "o"])) == [
        "vaswani-train",
        "--output_dir",
        "o",
        "--resume_from_checkpoint",
    ]


@pytest.mark.slow
def test_two_processes_stop_after_the_same_step_when_the_launcher_gets_sigterm(corpus, tmp_path):
    def launched(output_dir, *extra):
        return [
            *two_process_launch(),
            SCRIPTS / "train.py",
            *arguments_for(corpus, output_dir, "--batch_tokens", 400, *extra),
        ]

    straight = run_command(launched(tmp_path / "straight"), timeout=600)
    assert straight.returncode == 0, straight.stderr[-3000:]

    output_dir = tmp_path / "stopped"
    process = start(launched(output_dir))
    wait_for(lambda: logged_step(output_dir) >= 4, process, "step 4")
    process.send_signal(signal.SIGTERM)  # to the launcher, as a cluster does; it passes SIGTERM on to both ranks
    _, stderr = finish(process)
    assert process.returncode != 0
    step = int(re.search(r"SIGTERM received: stopped after step (\d+)", stderr)[1])
    checkpoint = output_dir / "checkpoints" / f"step_{step:07d}"
    assert (checkpoint / "random_states_0.pkl").is_file() and (checkpoint / "random_states_1.pkl").is_file()
    assert json.loads((checkpoint / "train_state.json").read_text())["step"] == step  # both ranks saved one step

    resumed = run_command(launched(output_dir, "--resume_from_checkpoint"), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_ends_like(tmp_path / "straight", output_dir)


# --- 2. SIGKILL and a full disk: the half-written checkpoint is never used, nothing before it is lost. ---


@pytest.mark.slow  # four training runs
def test_a_full_disk_and_a_kill_during_a_checkpoint_lose_only_the_steps_since_the_last_one(corpus, straight, tmp_path):
    output_dir = tmp_path / "out"
    checkpoints = output_dir / "checkpoints"
    arguments = arguments_for(corpus, output_dir)

    # The disk is full at step 12's checkpoint: a clear error, the half-written folder removed, step 6 intact.
    result = run_command(train_command(*arguments, fault="full-disk-at-step-12"))
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(
        r"could not write the checkpoint of step 12 in \S+ \(\[Errno 28\] No space left on device.*\)\. "
        r"The steps since \S+step_0000006 are lost, nothing else\. Free some space, then continue with:\n"
        r"  vaswani-train .*--resume_from_checkpoint",
        result.stderr,
    ), result.stderr[-3000:]
    assert sorted(path.name for path in checkpoints.iterdir()) == ["step_0000006"]

    # Resumed, it is killed (SIGKILL) while step 24's optimizer state is half written.
    process = start(train_command(*arguments, "--resume_from_checkpoint", fault="killable-at-step-24"))
    wait_for((output_dir / "halfway").exists, process, "the checkpoint of step 24 half written")
    process.kill()
    finish(process)
    assert process.returncode == -signal.SIGKILL
    assert sorted(path.name for path in checkpoints.iterdir()) == ["step_0000012", "step_0000018", "tmp_step_0000024"]
    assert not (checkpoints / "tmp_step_0000024" / "train_state.json").exists()

    # --resume_from_checkpoint takes step 18, never the half-written 24, deletes the leftovers (also an old checkpoint a kill left
    # half deleted) and ends exactly like the uninterrupted run.
    (checkpoints / "tmp_step_0000006.old").mkdir()
    result = run_command(train_command(*arguments, "--resume_from_checkpoint"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {checkpoints / 'step_0000018'}: step 18" in result.stdout
    assert_ends_like(straight, output_dir)


@pytest.mark.slow  # training runs under a full disk
@pytest.mark.parametrize("processes", [1, 2])
def test_writes_the_kernel_refuses_during_a_checkpoint_keep_the_last_one_and_end_every_rank(
    corpus, tmp_path, processes
):
    """Not a simulated error: the kernel fails the checkpoint's writes (RLIMIT_FSIZE), and safetensors and torch
    report it in their own exception types. One process, or two DDP ranks: all exit non-zero, soon."""
    output_dir = tmp_path / "out"
    arguments = arguments_for(corpus, output_dir)
    if processes == 2:
        command = [*two_process_launch(), FAULTY_TRAIN, "files-limited-at-step-12", *arguments]
    else:
        command = train_command(*arguments, fault="files-limited-at-step-12")
    started = time.monotonic()
    result = run_command(command, timeout=240)
    assert result.returncode != 0 and time.monotonic() - started < 200
    assert re.search(
        r"could not write the checkpoint of step 12 in \S+ \(.*\)\. The steps since \S+step_0000006 "
        r"are lost, nothing else\. Free some space, then continue with:\n  .*(train\.py|vaswani-train) .*--resume_from_checkpoint",
        result.stderr,
    ), result.stderr[-3000:]
    # With two ranks, the other one may still write its random state into the half-written folder as the main
    # process removes it: such a tmp_ folder is no checkpoint, and the next start removes it (remove_leftovers).
    names = sorted(path.name for path in (output_dir / "checkpoints").iterdir())
    assert [name for name in names if not fnmatch(name, "tmp_step_*")] == ["step_0000006"]
    assert load_file(str(output_dir / "checkpoints" / "step_0000006" / "model.safetensors"))  # still readable


def test_a_kill_while_an_old_checkpoint_is_deleted_leaves_no_checkpoint_without_its_files(tmp_path, monkeypatch):
    old = tmp_path / "checkpoints" / "step_0000006"
    old.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", TRAIN_STATE_FILE):
        (old / name).write_text("{}")

    def killed_halfway(path, *args, **kwargs):  # deletes one file, then the process dies
        if Path(path).exists():
            sorted(Path(path).iterdir())[0].unlink()
            raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        remove_checkpoint(old)
    assert list_checkpoints(tmp_path / "checkpoints") == []
    leftovers = [path.name for path in (tmp_path / "checkpoints").iterdir()]
    assert len(leftovers) == 1 and fnmatch(leftovers[0], "tmp_step_*")  # what the next start removes


def test_an_interim_checkpoint_stays_only_until_the_next_one(tmp_path):
    """A checkpoint written on a signal (off the --save_steps grid) must not push a regular one out of the last
    --save_total_limit, or the averaged model of a stopped and resumed run would differ from an uninterrupted one."""

    class OneProcess:  # what save_checkpoint asks of the Accelerator, for one process
        is_main_process, distributed_type = True, DistributedType.NO

        def wait_for_everyone(self):
            pass

        def save_state(self, folder):
            (Path(folder) / "model.safetensors").write_text("")

    config, root = VaswaniConfig.from_preset("tiny"), tmp_path / "checkpoints"
    for step, interim in ((6, False), (12, False), (18, False), (21, True)):
        save_checkpoint(OneProcess(), None, config, root, TrainState(step=step), keep=2, interim=interim)
    assert [path.name for path in list_checkpoints(root)] == ["step_0000012", "step_0000018", "step_0000021"]
    assert is_interim(root / "step_0000021") and not is_interim(root / "step_0000018")
    save_checkpoint(OneProcess(), None, config, root, TrainState(step=24), keep=2)
    assert [path.name for path in list_checkpoints(root)] == ["step_0000018", "step_0000024"]
    assert sorted(path.name for path in root.iterdir()) == ["step_0000018", "step_0000024"]


# --- 3. Non-finite losses: skipped and counted; too many in a row stop the run, naming the last good checkpoint. ---


@pytest.mark.slow  # two training runs
def test_non_finite_losses_are_skipped_and_counted_and_too_many_in_a_row_stop_the_run(corpus, tmp_path):
    output_dir = tmp_path / "out"
    flags = "--save_steps 2 --save_total_limit 5 --logging_steps 2 --max_bad_steps 3".split()
    result = run_command(
        train_command(*arguments_for(corpus, output_dir, *flags), fault="nan-at-steps-3-4-and-from-9")
    )
    assert result.returncode == 1, result.stderr[-3000:]
    checkpoints = output_dir / "checkpoints"
    assert (
        f"the loss was not finite for 3 steps in a row; stopped at step 11 (--max_bad_steps 3). The weights of "
        f"step 7 are the last known to give a finite loss: the last good checkpoint is {checkpoints}/step_0000006. "
        f"Continue from it with --resume_from_checkpoint {checkpoints}/step_0000006"
    ) in result.stderr
    assert "step 3: the loss is nan; step skipped, weights unchanged" in result.stdout + result.stderr

    # Steps 3 and 4 changed nothing: not the weights, not Adam's step count. Step 5 trained again.
    weights = {step: load_file(str(checkpoints / f"step_{step:07d}" / "model.safetensors")) for step in (2, 4, 6)}
    assert max_difference(weights[2], weights[4]) == 0.0 and max_difference(weights[4], weights[6]) > 0.0

    def adam_steps(step):
        state = torch.load(checkpoints / f"step_{step:07d}" / "optimizer.bin", weights_only=True)["state"]
        return {int(value["step"]) for value in state.values()}

    assert adam_steps(2) == adam_steps(4) == {2} and adam_steps(6) == {4}
    log = {record["step"]: record for record in read_log(output_dir)}
    assert [log[step]["skipped_steps"] for step in (2, 4, 6, 8, 10)] == [0, 2, 0, 0, 2]
    assert log[4]["loss"] != log[4]["loss"] and log[6]["loss"] == pytest.approx(log[6]["loss"])  # nan, then finite
    assert not (output_dir / "model.safetensors").exists()


@pytest.mark.slow  # a training run
def test_a_learning_rate_that_blows_up_the_weights_stops_the_run_at_max_bad_steps(corpus, tmp_path):
    """No injection: a learning rate of 1e30 makes the weights overflow after the first step, and the loss NaN."""
    output_dir = tmp_path / "out"
    flags = "--peak_lr 1e30 --warmup_steps 1 --logging_steps 1 --max_bad_steps 3".split()
    result = run_command(train_command(*arguments_for(corpus, output_dir, *flags)))
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        "the loss was not finite for 3 steps in a row; stopped at step 4 (--max_bad_steps 3). The weights of "
        "step 0 are the last known to give a finite loss: no checkpoint holds them. Start again after lowering the "
        "learning rate"
    ) in result.stderr
    log = read_log(output_dir)
    assert [record["skipped_steps"] for record in log] == [0, 1, 1, 1]
    assert list_checkpoints(output_dir / "checkpoints") == []


# --- 4. The output folder: unwritable or too small, an error before training starts. ---


def error_of(arguments, function=train.main):
    return exit_message(function, arguments)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_unwritable_output_folder_is_an_error_before_anything_else(corpus, tmp_path):
    # chmod does not stop root; /proc refuses new files and folders to everyone.
    for output_dir in ("/proc/self", "/proc/self/vaswani_out"):
        message = error_of(arguments_for(corpus, output_dir))
        assert f": error: cannot write to --output_dir {output_dir} (" in message
    # Before anything else: a dataset that does not exist is not even looked for.
    nowhere = [tmp_path / "nowhere" if a == corpus[0] else a for a in arguments_for(corpus, "/proc/self/out")]
    assert ": error: cannot write to --output_dir /proc/self/out (" in error_of(nowhere)
    (tmp_path / "a_file").write_text("")
    data = corpus[0]
    for script, main in ((train_tokenizer, train_tokenizer.main), (prepare_data, prepare_data.main)):
        for output_dir in ("/proc/self/vaswani_out", tmp_path / "a_file" / "out"):
            arguments = [
                "--output_dir",
                output_dir,
                *(["--dataset_dir", data] if script is train_tokenizer else ["--files", "x.en", "x.es"]),
            ]
            assert "cannot write to --output_dir" in error_of(arguments, main), (script, output_dir)


def test_a_disk_too_small_for_the_checkpoints_is_an_error_before_training(corpus, tmp_path, monkeypatch):
    config = VaswaniConfig.from_preset("tiny", vocab_size=36)
    parameters = VaswaniForConditionalGeneration(config).num_parameters()
    checkpoint = int(parameters * 12 * 1.1) + 2**20
    needed = 3 * checkpoint + 4 * parameters  # --save_total_limit 2: three at once, then the final model

    def disk_with(free):
        monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10**12, free=free))

    disk_with(needed - 1)
    message = error_of(arguments_for(corpus, tmp_path / "out"))
    assert re.search(
        rf"has {(needed - 1) / 1e6:,.0f} MB free, but the run needs about {needed / 1e6:,.0f} MB: up to 3 "
        rf"checkpoints of {checkpoint / 1e6:,.0f} MB \({parameters:,} parameters",
        message,
    ), message
    assert not (tmp_path / "out").exists()  # nothing written: the folder the command made is removed again
    disk_with(needed)
    model_class = VaswaniForConditionalGeneration
    assert check_free_space(tmp_path / "out", model_class, config, keep=2, existing=0) == needed
    assert check_free_space(tmp_path / "out", model_class, config, keep=2, existing=2) == checkpoint + 4 * parameters


# --- 5. Bad input: one clear error each (see docs/reliability.md for the cases other test files cover). ---


def test_bad_dataset_folders_are_named(corpus, tmp_path):
    (tmp_path / "empty").mkdir()
    split = datasets.Dataset.from_dict({"en": ["a"], "es": ["un"]})
    split.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict(train=split, validation=split).save_to_disk(str(tmp_path / "no_translation"))
    for folder, expected in (
        ("empty", "is not a dataset saved with save_to_disk"),
        ("single", "holds a single Dataset; expected a DatasetDict"),
        ("no_translation", "the train split has no 'translation' column (columns: ['en', 'es'])"),
    ):
        assert expected in error_of(
            ["--dataset_dir", tmp_path / folder, "--tokenizer", corpus[1], "--output_dir", tmp_path / "out"]
        )
    for folder, expected in (
        ("empty", "is not a dataset saved with save_to_disk"),  # the evaluation reads them too
        ("single", "holds a single Dataset"),
        ("no_translation", "no 'translation' column"),
    ):
        with pytest.raises(UsageError, match=expected):
            load_pairs(tmp_path / folder, "train", "en", "es")


def test_pairs_without_text_are_dropped_and_counted(corpus, tmp_path):
    from vaswani.training.data import tokenize_split

    # The first row has no translation at all: the languages come from the column's features, never from a row.
    rows = datasets.Dataset.from_dict(
        {
            "translation": [
                None,
                {"en": "the cat", "es": "el gato"},
                {"en": None, "es": "un"},
                {"en": "a dog", "es": None},
            ]
        }
    )
    tokenizer = load_tokenizer(str(corpus[1]))
    split = tokenize_split(rows, tokenizer, "en", "es")
    assert (split.without_text, len(split), split.rows.tolist()) == (3, 1, [1])
    datasets.DatasetDict(train=rows, validation=rows).save_to_disk(str(tmp_path / "data"))
    sources, references, without_text, split_pairs = load_pairs(str(tmp_path / "data"), "validation", "en", "es")
    assert (sources.to_pylist(), references.to_pylist(), without_text, split_pairs) == (["the cat"], ["el gato"], 3, 4)
    assert len(load_translation_dataset(tmp_path / "data", "en", "es")["train"]) == 4
    # prepare_data.py's Hugging Face path: the same pairs are invalid_text, counted, not a crash.
    splits, dropped = prepare_translation_dataset(
        datasets.DatasetDict(train=rows), "en", "es", valid_fraction=0.0, test_fraction=0.0
    )
    assert dropped == {"invalid_text": 3} and splits["train"]["translation"] == [{"en": "the cat", "es": "el gato"}]


# The corpus's tokenizer with <s> at id 0 and <pad> at id 1 (and no decoder).
SWAPPED_SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]


def copy_checkpoint(
    source,
    output_dir,
    files=(
        "config.json",
        "train_state.json",
        "model.safetensors",
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
    ),
):
    target = output_dir / "checkpoints" / source.name
    target.mkdir(parents=True)
    for name in files:
        shutil.copy(source / name, target / name)
    return target


def test_resume_refuses_checkpoints_that_do_not_fit(corpus, straight, tmp_path):
    source = list_checkpoints(straight / "checkpoints")[-1]
    resume = ["--dataset_dir", corpus[0], "--tokenizer", corpus[1], "--preset", "tiny", "--resume_from_checkpoint"]

    # Another size in the weights (config.json says tiny): the tensors that differ are named.
    other = VaswaniForConditionalGeneration(
        VaswaniConfig.from_preset("tiny", vocab_size=36, encoder_ffn_dim=128, decoder_ffn_dim=128)
    )
    other.save_pretrained(tmp_path / "other_size")
    checkpoint = copy_checkpoint(source, tmp_path / "a")
    shutil.copy(tmp_path / "other_size" / "model.safetensors", checkpoint / "model.safetensors")
    message = error_of([*resume, "--output_dir", tmp_path / "a"])
    assert (
        "does not fit the model of its config.json (12 tensors differ: "
        "model.decoder.layers.0.feed_forward.fc1.bias is (128,) in the checkpoint but (256,) in the model; "
        "model.decoder.layers.0.feed_forward.fc1.weight is (128, 64) in the checkpoint but (256, 64) in the "
        "model;"
    ) in message, message

    # Another architecture's weights (Marian): the missing and unexpected tensors are named.
    from transformers import MarianConfig, MarianMTModel

    MarianMTModel(
        MarianConfig(
            vocab_size=36,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_ffn_dim=256,
            decoder_ffn_dim=256,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            pad_token_id=0,
            decoder_start_token_id=1,
        )
    ).save_pretrained(tmp_path / "marian")
    checkpoint = copy_checkpoint(source, tmp_path / "b")
    shutil.copy(tmp_path / "marian" / "model.safetensors", checkpoint / "model.safetensors")
    message = error_of([*resume, "--output_dir", tmp_path / "b"])
    assert re.search(
        r"does not fit the model of its config\.json \(\d+ tensors differ: .*is missing from the "
        r"checkpoint",
        message,
    ), message

    # Another size in config.json: the field is named.
    checkpoint = copy_checkpoint(source, tmp_path / "c")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "d_model": 32}))
    assert "was trained with d_model=32, but this command asks for 64" in error_of(
        [*resume, "--output_dir", tmp_path / "c"]
    )

    # Weights only as a pickle (pytorch_model.bin): refused, never unpickled.
    checkpoint = copy_checkpoint(source, tmp_path / "d", files=("config.json", "train_state.json", "optimizer.bin"))
    torch.save(load_file(str(source / "model.safetensors")), checkpoint / "pytorch_model.bin")
    assert "has no model.safetensors; it cannot be resumed" in error_of([*resume, "--output_dir", tmp_path / "d"])

    # A tokenizer whose special ids are not the checkpoint's (same vocabulary size).
    swapped = word_tokenizer(tmp_path / "swapped", special_tokens=SWAPPED_SPECIAL_TOKENS, decoder=False)
    checkpoint = copy_checkpoint(source, tmp_path / "e")
    message = error_of(
        [
            "--dataset_dir",
            corpus[0],
            "--tokenizer",
            swapped,
            "--preset",
            "tiny",
            "--resume_from_checkpoint",
            "--output_dir",
            tmp_path / "e",
        ]
    )
    assert (
        f"config.pad_token_id of checkpoint {checkpoint} is 0 but the tokenizer's id is 1; "
        f"config.decoder_start_token_id of checkpoint {checkpoint} is 1 but the tokenizer's <s> and </s> are 0 and 2"
    ) in message


@pytest.mark.slow  # three training runs
def test_resume_refuses_settings_that_change_the_steps_unless_told(corpus, straight, tmp_path):
    source = list_checkpoints(straight / "checkpoints")[-1]
    copy_checkpoint(source, tmp_path / "out")
    resume = [*arguments_for(corpus, tmp_path / "out"), "--resume_from_checkpoint"]
    refused = run_command(
        train_command(*resume, "--batch_tokens", "900", "--seed", "3", "--gradient_accumulation_steps", "2")
    )
    assert refused.returncode == 1
    assert (
        "was written with other settings that decide the steps: batch_tokens was 800 and is now 900; "
        "gradient_accumulation_steps was 1 and is now 2; seed was 0 and is now 3. Resume with those, or pass "
        "--resume_with_changes"
    ) in refused.stderr, refused.stderr[-2000:]
    # The same word ids from a tokenizer that is not the same tokenizer (it decodes differently).
    same_ids = word_tokenizer(tmp_path / "same_ids", decoder=False)
    other = run_command(train_command(*[same_ids if a == corpus[1] else a for a in resume]))
    assert other.returncode == 1 and re.search(
        r"settings that decide the steps: tokenizer was '\w+' and is now", other.stderr
    ), other.stderr[-2000:]
    # Every setting the doc names is compared (scripts/train.py's STEP_SETTINGS and the run's own facts).
    saved = json.loads((source / "train_state.json").read_text())["settings"]
    assert {"batch_tokens", "gradient_accumulation_steps", "seed", "max_source_length", "max_target_length"} <= set(
        saved
    )
    assert {"long_pairs", "lr_schedule", "warmup_steps", "peak_lr", "adam_beta1", "adam_beta2", "adam_epsilon"} <= set(
        saved
    )
    assert {
        "label_smoothing_factor",
        "max_grad_norm",
        "num_processes",
        "mixed_precision",
        "train_split",
        "tokenizer",
    } <= (set(saved))
    # Told: it resumes, and says what changed.
    allowed = run_command(train_command(*resume, "--seed", "3", "--resume_with_changes"))
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "warning: resuming with changed settings (--resume_with_changes): seed was 0 and is now 3" in (
        allowed.stdout
    )


@pytest.mark.slow  # two training runs
def test_a_checkpoint_written_under_the_old_flag_names_resumes_exactly(corpus, straight, tmp_path):
    """Checkpoints written before the flags took `TrainingArguments`' names record grad_accum, adam_eps and
    label_smoothing: they resume, and a changed value is still caught under its new name."""
    output_dir = tmp_path / "out"
    first = run_command(train_command(*arguments_for(corpus, output_dir, "--stop_after", "12")))
    assert first.returncode == 0, first.stderr[-3000:]
    state_file = list_checkpoints(output_dir / "checkpoints")[-1] / "train_state.json"
    state = json.loads(state_file.read_text())
    for new, old in (
        ("gradient_accumulation_steps", "grad_accum"),
        ("adam_epsilon", "adam_eps"),
        ("label_smoothing_factor", "label_smoothing"),
    ):
        state["settings"][old] = state["settings"].pop(new)
    state_file.write_text(json.dumps(state))
    resume = arguments_for(corpus, output_dir, "--resume_from_checkpoint")
    changed = run_command(train_command(*resume, "--label_smoothing_factor", "0.2"))
    assert changed.returncode == 1 and "label_smoothing_factor was 0.1 and is now 0.2" in changed.stderr
    resumed = run_command(train_command(*resume))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_ends_like(straight, output_dir)


@pytest.mark.slow  # a training run to resume from
def test_resume_refuses_a_pickle_that_would_run_code(corpus, straight, tmp_path):
    """accelerate reads optimizer.bin with torch.load(weights_only=True): a pickle that calls a function is refused."""
    marker = tmp_path / "code_ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    checkpoint = copy_checkpoint(list_checkpoints(straight / "checkpoints")[-1], tmp_path / "out")
    torch.save(Payload(), checkpoint / "optimizer.bin")
    result = run_command(train_command(*arguments_for(corpus, tmp_path / "out"), "--resume_from_checkpoint"))
    assert result.returncode == 1 and not marker.exists()
    assert f"cannot load checkpoint {checkpoint} (UnpicklingError: Weights only load failed" in result.stderr, (
        result.stderr[-3000:]
    )


def test_evaluate_refuses_a_tokenizer_or_weights_that_do_not_fit(corpus, straight, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(straight, model_dir, ignore=shutil.ignore_patterns("checkpoints", "logs", "*.png"))
    base = ["--model", model_dir, "--dataset_dir", corpus[0], "--split", "validation", "--num_beams", 1]
    bigger = word_tokenizer(tmp_path / "bigger", extra_words=["perro2", "gato2"])
    assert f"the tokenizer has 38 tokens but the vocabulary of {model_dir} only 36" in error_of(
        [*base, "--tokenizer", bigger], evaluate_bleu.main
    )
    swapped = word_tokenizer(tmp_path / "swapped", special_tokens=SWAPPED_SPECIAL_TOKENS, decoder=False)
    assert (
        f"config.pad_token_id of {model_dir} is 0 but the tokenizer's id is 1; config.decoder_start_token_id of "
        f"{model_dir} is 1 but the tokenizer's <s> and </s> are 0 and 2"
    ) in error_of([*base, "--tokenizer", swapped], evaluate_bleu.main)
    weights = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    torch.save(weights, model_dir / "pytorch_model.bin")
    assert "has no model.safetensors (found pytorch_model.bin); weights are only read from safetensors files" in (
        error_of(base, evaluate_bleu.main)
    )


def test_tokenizer_script_skips_broken_text_and_names_bad_datasets(tmp_path, capsys):
    english = [f"the {word} sees a red cat" for word in ("dog", "bird", "house", "tree")] * 5
    spanish = [f"el {word} ve un gato rojo" for word in ("perro", "pájaro", "casa", "árbol")] * 5
    pairs = [{"en": e, "es": s} for e, s in zip(english, spanish)]
    pairs += [{"en": None, "es": "un gato"}, {"en": "caf\ufffd bytes that were not UTF-8", "es": "café"}]
    save_pairs(tmp_path / "data", pairs)
    train_tokenizer.main(
        ["--dataset_dir", str(tmp_path / "data"), "--vocab_size", "300", "--output_dir", str(tmp_path / "tok")]
    )
    assert "trained on 42 sentences (en + es, train split; 2 skipped: not text, or with U+FFFD)" in (
        capsys.readouterr().out
    )
    assert (tmp_path / "tok" / "tokenizer.json").is_file()

    main = train_tokenizer.main
    assert "language 'de' is not in the translation column (it has ['en', 'es'])" in error_of(
        ["--dataset_dir", tmp_path / "data", "--target_lang", "de", "--output_dir", tmp_path / "t2"], main
    )
    assert "does not exist; create it with scripts/prepare_data.py" in error_of(
        ["--dataset_dir", tmp_path / "nowhere", "--output_dir", tmp_path / "t3"], main
    )
    (tmp_path / "empty").mkdir()
    assert "is not a dataset saved with save_to_disk" in error_of(
        ["--dataset_dir", tmp_path / "empty", "--output_dir", tmp_path / "t4"], main
    )
