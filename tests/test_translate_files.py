"""Translating a file as a large job does (scripts/translate.py over vaswani.translation.files): shared by two gloo
processes under `accelerate launch`, batched by tokens, resumed after a process is killed without translating a line
twice, and refusing bad input in one sentence before any work, without leaving a partial output."""

import json
import re
import shutil
import signal
import time

import psutil
import pytest
from helpers import PAIRS, finish, run_command, save_pairs, script_command, start, two_process_launch

from vaswani.evaluation.bleu import token_batches
from vaswani.scripts import evaluate_bleu, translate


SOURCES = [source for source, _ in PAIRS]

# Chunks of 4 lines: the even ones long (4 sentences a line), the odd ones short, so that the first of two processes
# has several times the second's work; 53 lines make 14 chunks, the last of one line.
CHUNK = ["--chunk_lines", "4"]


def uneven_lines(count=53):
    long_line = " ".join(SOURCES)
    return [long_line if (i // 4) % 2 == 0 else SOURCES[i % 4] for i in range(count)]


def write_input(tmp_path, lines, name="in.txt"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def arguments(folder, source, output, *flags):
    return ["--model", folder, "--input", source, "--output", output, "--device", "cpu", *CHUNK, *flags]


def summary(stderr):
    """(sentences translated by the run, sentences of the input, sentences translated before it) from its last line."""
    found = re.search(r"Translated (\d+) of (\d+) sentences.*?(?:; (\d+) were translated before)?, into", stderr)
    assert found, stderr[-3000:]
    return int(found[1]), int(found[2]), int(found[3] or 0)


def test_two_processes_write_what_one_writes(trained_text_model, tmp_path):
    """Unequal shares (long lines in one process's chunks, a count that does not divide evenly), batched by tokens:
    the same bytes as one process, which are the lines the in-memory pipe writes, and no work folder left."""
    _, _, folder = trained_text_model
    source = write_input(tmp_path, uneven_lines())
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    translate.main(arguments(folder, source, one, "--max_tokens", "40"))
    launched = start(
        [*two_process_launch(), script_command("translate")[1], *arguments(folder, source, two, "--max_tokens", "40")]
    )
    _, stderr = finish(launched, timeout=600)
    assert launched.returncode == 0, stderr[-5000:]
    assert summary(stderr) == (53, 53, 0) and "2 processes" in stderr
    assert two.read_bytes() == one.read_bytes()
    piped = run_command(
        script_command("translate", "--model", folder, "--device", "cpu"), input=source.read_text(), check=True
    )
    assert one.read_text(encoding="utf-8") == piped.stdout
    assert one.read_text(encoding="utf-8").splitlines()[4:8] == [target for _, target in PAIRS]
    assert not (tmp_path / "one.txt.parts").exists() and not (tmp_path / "two.txt.parts").exists()


@pytest.mark.slow
def test_ctranslate2_shares_a_file_between_processes_as_the_model_does(trained_text_model, tmp_path):
    """--ctranslate2 on a file: chunks batched by tokens, shared by two gloo processes with unequal work, the same
    bytes as one process and as the pipe, which holds its input whole."""
    pytest.importorskip("ctranslate2")
    from vaswani.scripts import export_ctranslate2

    _, _, folder = trained_text_model
    export_ctranslate2.main(["--model", folder, "--output_dir", tmp_path / "ct2"])
    source = write_input(tmp_path, [*uneven_lines(), ""])
    one, two = tmp_path / "one.txt", tmp_path / "two.txt"
    flags = ["--ctranslate2", tmp_path / "ct2", "--max_tokens", "40"]
    translate.main(arguments(folder, source, one, *flags))
    launched = start([*two_process_launch(), script_command("translate")[1], *arguments(folder, source, two, *flags)])
    _, stderr = finish(launched, timeout=600)
    assert launched.returncode == 0, stderr[-5000:]
    assert summary(stderr) == (54, 54, 0) and "with CTranslate2 (float32)" in stderr and "2 processes" in stderr
    assert two.read_bytes() == one.read_bytes()
    piped = run_command(
        script_command("translate", "--model", folder, "--ctranslate2", tmp_path / "ct2"),
        input=source.read_text(),
        check=True,
    )
    assert one.read_text(encoding="utf-8") == piped.stdout
    lines = one.read_text(encoding="utf-8").splitlines()
    assert lines[4:8] == [target for _, target in PAIRS] and lines[-1] == ""
    assert not (tmp_path / "two.txt.parts").exists()


def test_a_killed_run_resumes_without_translating_a_line_twice(trained_text_model, tmp_path, capsys):
    """One of two processes killed once chunks are on disk: no output, the chunks kept; a resume with other settings
    refused; the same command (here in one process) translates only the lines not done and writes what an unbroken
    run writes."""
    _, _, folder = trained_text_model
    source = write_input(tmp_path, uneven_lines(200))
    output, parts = tmp_path / "out.txt", tmp_path / "out.txt.parts"
    launched = start([*two_process_launch(), script_command("translate")[1], *arguments(folder, source, output)])
    deadline = time.monotonic() + 300
    while len(list(parts.glob("*[0-9].txt"))) < 4:
        assert launched.poll() is None and time.monotonic() < deadline, finish(launched)[1][-3000:]
        time.sleep(0.02)
    workers = psutil.Process(launched.pid).children(recursive=True)
    max(workers, key=lambda worker: worker.pid).send_signal(signal.SIGKILL)
    finish(launched, timeout=120)
    assert launched.returncode != 0 and not output.exists()
    done_lines = sum(min(4, 200 - 4 * int(part.stem)) for part in parts.glob("*[0-9].txt"))
    assert 0 < done_lines < 200

    with pytest.raises(SystemExit) as refused:
        translate.main(arguments(folder, source, output, "--num_beams", "3"))
    assert str(refused.value.code).endswith(
        f"error: {parts} holds the work of another run (num_beams was 4, now 3): run the same command again, or "
        f"remove {parts} to start over."
    )
    capsys.readouterr()

    translate.main(arguments(folder, source, output))
    assert summary(capsys.readouterr().err) == (200 - done_lines, 200, done_lines)
    unbroken = tmp_path / "unbroken.txt"
    translate.main(arguments(folder, source, unbroken))
    assert output.read_bytes() == unbroken.read_bytes()
    assert not parts.exists()


@pytest.mark.parametrize(
    "mistake",
    ["missing model", "not UTF-8", "too long", "prefixes miscounted", "max_tokens 0"],
)
def test_bad_input_is_refused_in_one_sentence_before_any_work(trained_text_model, tmp_path, mistake):
    _, _, folder = trained_text_model
    lines = SOURCES * 3
    source = write_input(tmp_path, lines)
    output = tmp_path / "out.txt"
    flags, expected = [], None
    if mistake == "missing model":
        folder, expected = tmp_path / "nothing", f"--model {tmp_path / 'nothing'} does not exist."
    elif mistake == "not UTF-8":
        source.write_bytes(b"Jesus wept.\nThe Lord \xff is my shepherd.\n")
        expected = f"line 2 of --input {source} is not UTF-8 text (byte 10 of the line): convert the file to UTF-8."
    elif mistake == "too long":
        source = write_input(tmp_path, [*lines[:9], " ".join(SOURCES * 6), *lines[9:]])
        expected = "line 10 of --input is"
    elif mistake == "prefixes miscounted":
        flags = ["--prefixes", write_input(tmp_path, ["El"], "prefixes.txt")]
        expected = "--prefixes has 1 lines but --input 12: give one per sentence."
    else:
        flags, expected = ["--max_tokens", "0"], "--max_tokens must be at least 1, got 0."
    done = run_command(script_command("translate", *arguments(folder, source, output, *flags)))
    message = done.stderr.strip().splitlines()[-1]
    assert done.returncode in (1, 2) and message.startswith("translate.py: error: "), done.stderr[-3000:]
    assert expected in message and "Traceback" not in done.stderr
    assert not output.exists() and not (tmp_path / "out.txt.parts").exists()


def test_two_processes_evaluate_as_one(trained_text_model, tmp_path, capsys):
    """vaswani-evaluate under accelerate launch: each process translates its stretch of the split (11 pairs: one
    more for the first), the main process scores them all: the hypotheses and scores of one process."""
    _, _, trained = trained_text_model
    folder = shutil.copytree(trained, tmp_path / "model")  # eval_results.json is written beside the model
    pairs = [{"en": source, "es": target} for source, target in (PAIRS * 3)[:11]]
    data = save_pairs(tmp_path / "data", pairs)
    common = [
        "--model",
        folder,
        "--dataset_dir",
        data,
        "--split",
        "validation",
        "--device",
        "cpu",
        "--max_tokens",
        "30",
    ]
    evaluate_bleu.main([*common, "--output", tmp_path / "one.txt"])
    one = json.loads((folder / "eval_results.json").read_text())["validation"]
    launched = start(
        [*two_process_launch(), script_command("evaluate_bleu")[1], *common, "--output", tmp_path / "two.txt"]
    )
    stdout, stderr = finish(launched, timeout=600)
    assert launched.returncode == 0, stderr[-5000:]
    assert (tmp_path / "two.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    two = json.loads((folder / "eval_results.json").read_text())["validation"]
    assert {key: two[key] for key in ("bleu", "tokenized_bleu", "chrf", "sentences")} == {
        key: one[key] for key in ("bleu", "tokenized_bleu", "chrf", "sentences")
    }
    assert one["bleu"] == 100.0 and stdout.count("BLEU = ") == 2  # the model learnt them; one process printed


def test_standard_input_is_refused_under_several_processes(trained_text_model, monkeypatch):
    """A pipe cannot be shared: under accelerate launch (torchrun's WORLD_SIZE), the command asks for files at once."""
    _, _, folder = trained_text_model
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as refused:
        translate.main(["--model", folder, "--device", "cpu"])
    assert str(refused.value.code).endswith(
        "error: standard input and output are one process's: under accelerate launch, give --input and --output files."
    )


def test_batches_by_tokens_hold_the_budget_with_their_padding():
    """fairseq's --max-tokens: a batch's sentences times its longest stay within the budget, and a batch takes every
    sentence that still fits; a sentence longer than the budget goes alone."""
    lengths = [5, 30, 10, 10, 12, 50, 3, 10, 9]
    batches = token_batches(lengths, 40)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    assert batches == [[5], [1], [4, 2, 3], [7, 8, 0, 6]]  # the last exactly 40: 4 sentences of 10 tokens
    for batch in batches[:-1]:
        longest = lengths[batch[0]]
        assert len(batch) * longest <= 40 or len(batch) == 1
        assert (len(batch) + 1) * longest > 40  # the next sentence did not fit
