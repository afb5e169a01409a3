"""What the test modules share: the checkout's paths, the tiny corpora and the word-level tokenizers they train on,
the ways to run the scripts as a user runs them, and the readers of what a run wrote.

A plain module: no tests and no fixtures in it (the fixtures are in conftest.py, which imports from here). pytest puts
tests/ on sys.path, so test modules import it by its bare name: `from helpers import REPO_ROOT, word_tokenizer`.
No name here starts with `test`: pytest would collect it in every module that imports it.
"""

import contextlib
import functools
import json
import multiprocessing
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


REPO_ROOT = Path(__file__).resolve().parent.parent  # for the files the tests run or read: scripts, configs, docs
SCRIPTS = REPO_ROOT / "scripts"


# --- Token ids for the tiny model, no tokenizer. ---

VOCAB_SIZE = 100


def tiny_model_config(**overrides) -> VaswaniConfig:
    """The tiny preset over VOCAB_SIZE ids, without dropout (training-mode and evaluation-mode outputs compare)."""
    return VaswaniConfig.from_preset(
        "tiny", **{"vocab_size": VOCAB_SIZE, "dropout": 0.0, "max_position_embeddings": 128, **overrides}
    )


def make_translation_pairs() -> list[tuple[list[int], list[int]]]:
    """Eight (source, target) pairs of 3 to 8 tokens + end-of-sentence: the target is the source reversed and mapped
    through a fixed permutation, so that translating needs the positions, the source mask and every source token."""
    generator = torch.Generator().manual_seed(7)
    pairs = []
    for length in (3, 4, 5, 5, 6, 7, 8, 8):
        source = torch.randint(4, VOCAB_SIZE, (length,), generator=generator).tolist()
        target = [(token * 37) % (VOCAB_SIZE - 4) + 4 for token in reversed(source)]
        pairs.append((source + [2], target + [2]))
    return pairs


def pad_pairs(pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids right-padded with 0, attention_mask, labels padded with -100)."""
    source_length, target_length = (max(len(pair[side]) for pair in pairs) for side in (0, 1))
    input_ids = torch.tensor([source + [0] * (source_length - len(source)) for source, _ in pairs])
    labels = torch.tensor([target + [-100] * (target_length - len(target)) for _, target in pairs])
    return input_ids, (input_ids != 0).long(), labels


def trained_on(pairs, config: VaswaniConfig):
    """A model of `config` trained on `pairs` (seed 0, Adam) until it translates them: targets at about 0.98
    probability, so that greedy decoding gives every pair's."""
    input_ids, attention_mask, labels = pad_pairs(pairs)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.02:
            break
    return model.eval()


# A vocabulary of 24 ids: 0-3 padding, start, </s> and unknown, then 20 words.
SMALL_VOCAB_SIZE, FIRST_WORD = 24, 4


@functools.cache
def small_vocabulary_model() -> VaswaniForConditionalGeneration:
    """The tiny preset trained on twelve pairs of SMALL_VOCAB_SIZE ids (each target its source reversed and mapped
    through a permutation): it ends its translations where they end, and other sources' after its own fashion, at
    lengths of their own. One per process: copy it before changing it."""
    rng = random.Random(3)
    pairs = []
    for length in (1, 2, 3, 3, 4, 5, 5, 6, 6, 7, 7, 8):
        source = [rng.randrange(FIRST_WORD, SMALL_VOCAB_SIZE) for _ in range(length)]
        target = [(token * 7) % (SMALL_VOCAB_SIZE - FIRST_WORD) + FIRST_WORD for token in reversed(source)]
        pairs.append((source + [2], target + [2]))
    return trained_on(pairs, tiny_model_config(vocab_size=SMALL_VOCAB_SIZE))


# --- Text. ---

# Four real translations, for a tiny model with a BPE tokenizer that learns them by heart.
PAIRS = [
    ("In the beginning God created the heavens and the earth.", "En el principio creó Dios los cielos y la tierra."),
    ("Jesus wept.", "Y lloró Jesús."),
    ("The Lord is my shepherd.", "El Señor es mi pastor."),
    ("Love is patient and kind.", "El amor es sufrido, es benigno."),
]

# A word-for-word "translation" between two 16-word vocabularies: the tiny preset learns it in a few dozen steps.
ENGLISH = "the a red blue green big small cat dog bird house tree sees eats likes has".split()
SPANISH = "el un rojo azul verde grande pequeño gato perro pájaro casa árbol ve come quiere tiene".split()
LEXICON = dict(zip(ENGLISH, SPANISH))


def word_pair(english):
    """The translation column's entry for an English sentence of ENGLISH's words: {"en": ..., "es": ...}."""
    return {"en": english, "es": " ".join(LEXICON[word] for word in english.split())}


def make_dataset(folder, pairs_per_split, seed=0, min_words=3, max_words=10):
    """A DatasetDict of random word_pairs, {split: count} of them, as scripts/prepare_data.py lays them out."""
    from datasets import Dataset, DatasetDict  # here: every test session imports this module, few need datasets

    rng = random.Random(seed)

    def split(count, name):
        english = [" ".join(rng.choices(ENGLISH, k=rng.randint(min_words, max_words))) for _ in range(count)]
        return Dataset.from_dict(
            {"id": [f"{name}.{i}" for i in range(count)], "translation": [word_pair(e) for e in english]}
        )

    DatasetDict({name: split(count, name) for name, count in pairs_per_split.items()}).save_to_disk(str(folder))
    return folder


def save_pairs(folder, pairs, **columns):
    """`pairs` (translation entries) saved as a DatasetDict whose train and validation splits are both those pairs;
    `columns` come before the translation column (e.g. id=[...])."""
    from datasets import Dataset, DatasetDict

    split = Dataset.from_dict({**columns, "translation": pairs})
    DatasetDict(train=split, validation=split).save_to_disk(str(folder))
    return folder


WMT14_CARD = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
dataset_info:
  config_name: de-en
  features:
  - name: translation
    dtype:
      translation:
        languages:
        - de
        - en
---
"""


def write_wmt14_folder(folder, pairs_per_split):
    """A local folder in the layout of the Hub's wmt14 (a card naming the configs, Parquet files per config)."""
    from datasets import Dataset

    (folder / "de-en").mkdir(parents=True)
    (folder / "README.md").write_text(WMT14_CARD)
    for split, count in pairs_per_split.items():
        rows = [{"translation": {"de": f"Satz {split} {i}.", "en": f"Sentence {split} {i}."}} for i in range(count)]
        Dataset.from_list(rows).to_parquet(str(folder / "de-en" / f"{split}-00000-of-00001.parquet"))


# --- Word-level tokenizers. ---

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0 to 3 in this order: the model's defaults


def word_tokenizer(
    folder=None,
    *,
    words=(*ENGLISH, *SPANISH),
    extra_words=(),
    special_tokens=SPECIAL_TOKENS,
    decoder=True,
    pair=False,
    bare=False,
    **options,
):
    """A fast tokenizer with one token per word: `special_tokens` (their order gives their ids), then `words` and
    `extra_words`, each once. It splits on white space and, like the project's BPE tokenizer, ends every sequence
    with </s>.

    folder: save it there and return the folder (what --tokenizer takes); without one, return the tokenizer.
    decoder: decode with WordPiece's decoder (words joined by spaces, none before punctuation); False: no decoder,
        the same ids from another tokenizer.
    pair: a template for pairs of sequences too (</s> after each), as the BPE tokenizer has.
    bare: the vocabulary alone, no pre-tokenizer, post-processor or decoder: a tokenizer that does not end sequences
        with </s>, which the scripts refuse.
    options: PreTrainedTokenizerFast's, e.g. bos_token=None for a tokenizer without <s>, model_input_names.
    """
    vocab = {word: i for i, word in enumerate(dict.fromkeys([*special_tokens, *words, *extra_words]))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    if not bare:
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        backend.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>" if pair else None, special_tokens=[("</s>", vocab["</s>"])]
        )
        if decoder:
            backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    roles = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    options = {name: value for name, value in {**roles, **options}.items() if value is not None}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **options)
    if folder is None:
        return tokenizer
    tokenizer.save_pretrained(folder)
    return folder


# --- Running the scripts as a user runs them. ---

# The tiny preset on the short schedule, with small batches: it learns the word mapping within a hundred steps.
TINY = ["--preset", "tiny", "--lr_schedule", "short", "--peak_lr", "3e-3"]
FAST = [*TINY, "--warmup_steps", "20", "--batch_tokens", "500", "--logging_steps", "5"]


def script_env(**variables):
    """The environment of a script the tests run: this one with one thread per process (where the cores are shared,
    OpenMP threads spinning against other processes make the tiny model 10-30 times slower), and `variables`."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **variables}


def script_command(name, *arguments):
    """The command that runs scripts/NAME.py with `arguments`, as strings."""
    return [sys.executable, str(SCRIPTS / f"{name}.py"), *map(str, arguments)]


def train_arguments(data, tokenizer, output_dir, *flags):
    """scripts/train.py's arguments for a corpus (dataset folder and tokenizer) and an output folder, then `flags`."""
    return ["--dataset_dir", data, "--tokenizer", tokenizer, "--output_dir", output_dir, *flags]


# vaswani-train with a fault injected through its callbacks: tests/train_with_faults.py FAULT [arguments].
FAULTY_TRAIN = REPO_ROOT / "tests" / "train_with_faults.py"


def train_command(*arguments, fault=None):
    """The command that runs scripts/train.py; with `fault` (a name of train_with_faults.FAULTS), the console script
    with that fault injected."""
    if fault is None:
        return script_command("train", *arguments)
    return [sys.executable, str(FAULTY_TRAIN), fault, *map(str, arguments)]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch(*options, port=None):
    """`accelerate launch` with `options` and --main_process_port `port` (default: a free one); the script and its
    arguments follow."""
    return [sys.executable, "-m", "accelerate.commands.launch", *map(str, options),
            "--main_process_port", str(free_port() if port is None else port)]  # fmt: skip


def two_process_launch(config=None):
    """accelerate_launch of two processes on this machine (gloo on the CPU) in float32: plain DDP (--multi_gpu), or
    configs/CONFIG."""
    which = ["--multi_gpu"] if config is None else ["--config_file", REPO_ROOT / "configs" / config]
    return accelerate_launch(*which, "--num_processes", 2, "--num_machines", 1, "--mixed_precision", "no",
                             "--dynamo_backend", "no")  # fmt: skip


def run_command(command, *, env=None, timeout=300, check=False, input=None):
    """Run `command` (its items as strings) from the checkout's root in `env` (default script_env()), its output
    captured, `input` (text) on its standard input. check: fail the test with the command's output unless it exits
    with 0."""
    command = [str(part) for part in command]
    env = script_env() if env is None else env
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env, input=input
    )
    if check:
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def run_script(name, *arguments, timeout=600):
    """Run scripts/NAME.py as a user would; fail the test with its output if it fails."""
    return run_command(script_command(name, *arguments), timeout=timeout, check=True)


def start(command, *, cwd=REPO_ROOT, env=None):
    """Start `command` as run_command runs it (from `cwd`, in `env`, default script_env()), in the background. Its
    output goes to files: a full pipe would block it. Its Python processes dump their stacks on SIGABRT
    (faulthandler), for finish() to show a hang."""
    stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    command = [str(part) for part in command]
    env = {**(script_env() if env is None else env), "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True)
    process.output_files = stdout, stderr
    return process


def finish(*processes, timeout=120):
    """Wait for processes from start(), `timeout` seconds for all; the (stdout, stderr) of one, a list of them for
    several. Where they run past it, the test fails with what each printed and the Python stack of every process they
    started (a launcher's workers, whose output the launcher relays, included), and none is left running."""
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        for process in processes:
            abort_tree(process)
        outputs = map(read_output, processes)
        report = (
            f"$ {' '.join(process.args)}\n{out[-3000:]}\n{err[-12000:]}"
            for process, (out, err) in zip(processes, outputs)
        )
        pytest.fail(f"ran past {timeout} s:\n" + "\n\n".join(report), pytrace=False)
    outputs = [read_output(process) for process in processes]
    return outputs[0] if len(processes) == 1 else outputs


def abort_tree(process):
    """SIGABRT to everything `process` started, then to it (so that a launcher still relays its workers' stacks);
    SIGKILL to whatever outlives that."""
    root = psutil.Process(process.pid)
    for group in (root.children(recursive=True), [root]):
        for member in group:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGABRT)
        for member in psutil.wait_procs(group, timeout=10)[1]:
            member.kill()
    process.wait()


def read_output(process):
    return tuple(file.seek(0) or file.read() for file in process.output_files)


def exit_message(main, arguments):
    """The message a command's `main` exits with on `arguments` (as strings), run in this process."""
    with pytest.raises(SystemExit) as raised:
        main([str(argument) for argument in arguments])
    return str(raised.value)


# --- Jobs on two processes of this machine (gloo). ---


def _run_rank(rank: int, job, port: int, work_dir: Path, collective_timeout: timedelta) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=collective_timeout
    )
    torch.save(job(rank, work_dir), work_dir / f"result_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def run_on_two_ranks(job, work_dir: Path, preload: str, job_timeout: float, collective_timeout: timedelta) -> list:
    """Runs `job(rank, work_dir)` on two gloo processes and returns each rank's result (what it returned, saved in
    `work_dir`); kills them after `job_timeout` seconds. A collective waits `collective_timeout` for its partner.

    The processes fork from a server that has imported `preload` (the job's module: torch, transformers) once for
    every job, where spawn would import them again in each rank of each job (about 10 s on 2 cores). An exception
    raised in a rank is raised here (torch.multiprocessing.ProcessRaisedException, with its traceback).
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload([preload])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # read when the fork server imports torch
        context = mp.start_processes(
            _run_rank,
            args=(job, free_port(), work_dir, collective_timeout),
            nprocs=2,
            join=False,
            start_method="forkserver",
        )
    deadline = time.monotonic() + job_timeout
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail(f"{job.__name__} did not finish within {job_timeout} s (a collective hangs?)")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
    return [torch.load(work_dir / f"result_rank{rank}.pt", weights_only=True) for rank in range(2)]


# --- The documentation. ---


def docs_block(page, heading):
    """The first ```python block after `heading` in `page` (a path from the checkout's root, e.g. docs/exports.md)."""
    text = (REPO_ROOT / page).read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.DOTALL)[1]


# --- What a run wrote. ---


def read_log(output_dir):
    return [json.loads(line) for line in (Path(output_dir) / "train_log.jsonl").read_text().splitlines()]


def max_difference(first, second):
    """The largest absolute difference between two state dicts of the same tensors, computed in float64."""
    assert first.keys() == second.keys()
    return max((first[key].double() - second[key].double()).abs().max().item() for key in first)
