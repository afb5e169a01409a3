"""WMT scale (slow: python -m pytest tests -m slow): a training process's own memory does not grow with the corpus.

Tokenized pairs live in memory-mapped Arrow files and batches are computed from two length arrays, so a run on 1M
pairs holds about what a run on 30k pairs holds. Measured as the peak anonymous memory (RssAnon) of the training
process itself: pages of the memory-mapped files count in its RSS too, but the kernel can drop those.
docs/benchmarks/data_scale.py measures the same up to 4.5M pairs, with 1 and 2 processes.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
from test_training import make_dataset, make_tokenizer


SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
# Two steps of the tiny preset, without evaluation: the memory is that of loading and batching the corpus.
TWO_STEPS = (
    "--preset tiny --max_steps 2 --batch_tokens 2000 --save_every 2 --average_last 1 --eval_every 0 "
    "--eval_bleu_samples 0 --report_to none"
).split()


def rss_anon_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon for process {pid}")


def peak_anonymous_memory(data, tokenizer, output_dir):
    """Run two steps of the tiny preset; the highest RssAnon of the training process, sampled every 0.1 s."""
    command = [sys.executable, str(SCRIPTS / "train.py"), "--dataset_dir", str(data), "--tokenizer", str(tokenizer)]
    command += ["--output_dir", str(output_dir), *TWO_STEPS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while process.poll() is None:
        try:
            peak = max(peak, rss_anon_bytes(process.pid))
        except (OSError, RuntimeError):  # the process just ended
            break
        time.sleep(0.1)
    assert process.wait(timeout=900) == 0, process.stderr.read()[-3000:]
    return peak


@pytest.mark.slow
def test_a_million_pairs_need_at_most_500_mb_more_than_thirty_thousand(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tokenizer")
    small = make_dataset(tmp_path / "small", {"train": 30_000, "validation": 200})
    pairs = datasets.load_from_disk(str(small))
    million = datasets.concatenate_datasets([pairs["train"]] * 34).select(range(1_000_000))
    datasets.DatasetDict(train=million, validation=pairs["validation"]).save_to_disk(str(tmp_path / "million"))

    baseline = peak_anonymous_memory(small, tokenizer, tmp_path / "out_small")
    at_scale = peak_anonymous_memory(tmp_path / "million", tokenizer, tmp_path / "out_million")
    assert at_scale - baseline < 500 * 2**20, f"{baseline / 2**20:.0f} MiB -> {at_scale / 2**20:.0f} MiB"
