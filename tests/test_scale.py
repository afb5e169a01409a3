"""WMT scale (slow: python -m pytest tests -m slow): a training process's own memory does not grow with the corpus.

Tokenized pairs live in memory-mapped Arrow files and batches are computed from two length arrays, so a run on 1M
pairs holds about what a run on 30k pairs holds. Measured as the peak anonymous memory (RssAnon) of the training
process itself: pages of the memory-mapped files count in its RSS too, but the kernel can drop those.
benchmarks/data_scale.py measures the same up to 4.5M pairs, with 1 and 2 processes.
"""

import time

import datasets
import pytest
from helpers import finish, make_dataset, start, train_arguments, train_command, word_tokenizer


# Two steps of the tiny preset, without evaluation: the memory is that of loading and batching the corpus.
TWO_STEPS = (
    "--preset tiny --max_steps 2 --batch_tokens 2000 --save_steps 2 --average_last 1 --eval_steps 0 "
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
    process = start(train_command(*train_arguments(data, tokenizer, output_dir, *TWO_STEPS)))
    peak = 0
    while process.poll() is None:
        try:
            peak = max(peak, rss_anon_bytes(process.pid))
        except (OSError, RuntimeError):  # the process just ended
            break
        time.sleep(0.1)
    _, stderr = finish(process, timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    return peak


@pytest.mark.slow
def test_a_million_pairs_need_at_most_500_mb_more_than_thirty_thousand(tmp_path):
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    small = make_dataset(tmp_path / "small", {"train": 30_000, "validation": 200})
    pairs = datasets.load_from_disk(str(small))
    million = datasets.concatenate_datasets([pairs["train"]] * 34).select(range(1_000_000))
    datasets.DatasetDict(train=million, validation=pairs["validation"]).save_to_disk(str(tmp_path / "million"))

    baseline = peak_anonymous_memory(small, tokenizer, tmp_path / "out_small")
    at_scale = peak_anonymous_memory(tmp_path / "million", tokenizer, tmp_path / "out_million")
    assert at_scale - baseline < 500 * 2**20, f"{baseline / 2**20:.0f} MiB -> {at_scale / 2**20:.0f} MiB"
