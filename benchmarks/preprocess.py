"""vaswani's tokenization of a corpus beside fairseq-preprocess: the same pairs and the same BPE, each tool in
processes of its own, one after the other.

    python -m benchmarks.preprocess --corpus CORPUS --tokenizer TOK --workdir WORK [--workers 2] [--languages en es]
                                    [--fairseq_python PY] [--output docs/benchmarks/preprocess]

CORPUS is a DatasetDict of scripts/prepare_data.py, TOK its shared BPE; fairseq runs in the Python of
scripts/install_fairseq.sh (--fairseq_python). Writes OUTPUT.json and OUTPUT.md.
"""

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from benchmarks import harness
from benchmarks.data_scale_work import cache_files, train_rows
from benchmarks.harness import folder_bytes, run_measured


SPLITS = {"train": "train", "validation": "valid", "test": "test"}  # the DatasetDict's names -> fairseq's


# --- The steps' own processes: `python -m benchmarks.preprocess bpe|vaswani ...`. ---


def write_bpe(corpus, tokenizer_dir, output, workers, languages):
    """Step 1: each split's sentences as space-separated BPE tokens, in fairseq's file names (OUTPUT/train.en, ...)."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    os.environ["RAYON_NUM_THREADS"] = str(workers)  # before the tokenizer's first parallel call
    encoder = AutoTokenizer.from_pretrained(tokenizer_dir).backend_tokenizer
    output.mkdir(parents=True, exist_ok=True)
    dataset = load_from_disk(str(corpus))
    for split, name in SPLITS.items():
        pairs = dataset[split].with_format("arrow")
        files = {language: open(output / f"{name}.{language}", "w", encoding="utf-8") for language in languages}
        for start in range(0, len(pairs), 20_000):
            column = pairs[start : start + 20_000].column("translation").combine_chunks()
            for language, file in files.items():
                texts = [text or "" for text in column.field(language).to_pylist()]
                for encoding in encoder.encode_batch(texts, add_special_tokens=False):
                    file.write(" ".join(encoding.tokens) + "\n")
        for file in files.values():
            file.close()


def tokenize_for_training(corpus, tokenizer_dir, workers, languages):
    """Step 3: the first tokenization of vaswani-train, of each split; prints the train split's source tokens."""
    from datasets import load_from_disk

    from vaswani.corpora.tokenizer import load_tokenizer
    from vaswani.training.data import tokenize_split

    tokenizer = load_tokenizer(tokenizer_dir)
    dataset = load_from_disk(str(corpus))
    tokenized = {split: tokenize_split(dataset[split], tokenizer, *languages, num_proc=workers) for split in SPLITS}
    lengths = tokenized["train"].source_lengths
    print(json.dumps({"train_source_tokens": int(lengths.sum()), "train_pairs": len(lengths)}))


# --- The comparison. ---


STEPS = {  # each step's row on the page
    "bpe": "1. BPE text for fairseq (the tokenizer's encoder)",
    "fairseq": "2. fairseq-preprocess (dictionary, binarising)",
    "bpe + fairseq": "1 + 2: fairseq's whole path",
    "vaswani": "3. vaswani's first tokenization (text to ids)",
}


def fairseq_tokens(log_text, language):
    """The sentences and tokens fairseq-preprocess logs for train.LANGUAGE: "[en] .../train.en: N sents, T tokens"."""
    match = re.search(rf"\[{language}\] \S*train\.{language}: (\d+) sents, (\d+) tokens", log_text)
    if match is None:
        raise SystemExit(f"fairseq-preprocess logged no token count for train.{language}")
    return int(match.group(1)), int(match.group(2))


def compare(args):
    corpus, work = args.corpus, args.workdir
    train_pairs, (source, target) = train_rows(corpus), args.languages
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for cached in cache_files(corpus):  # vaswani's first tokenization, as a new corpus meets it
        cached.unlink()
    me = [sys.executable, "-m", "benchmarks.preprocess"]
    common = ["--corpus", str(corpus), "--tokenizer", str(args.tokenizer), "--workdir", str(work)]
    common += ["--workers", str(args.workers), "--languages", source, target]
    prefixes = {name: str(work / "bpe" / name) for name in SPLITS.values()}
    fairseq = [
        args.fairseq_python, "-m", "fairseq_cli.preprocess", "--source-lang", source, "--target-lang", target,
        "--trainpref", prefixes["train"], "--validpref", prefixes["valid"], "--testpref", prefixes["test"],
        "--destdir", str(work / "fairseq"), "--joined-dictionary", "--dataset-impl", "mmap",
        "--workers", str(args.workers),
    ]  # fmt: skip
    commands = {"bpe": [*me, "bpe", *common], "fairseq": fairseq, "vaswani": [*me, "vaswani", *common]}
    single_thread, rows = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "true"}, {}
    for name, command in commands.items():
        print(STEPS[name], flush=True)
        rows[name] = run_measured(command, env=single_thread, log=work / f"{name}.log")
    rows["bpe"]["bytes"] = folder_bytes([work / "bpe"])
    rows["fairseq"]["bytes"] = folder_bytes([work / "fairseq"])
    rows["vaswani"]["bytes"] = sum(path.stat().st_size for path in cache_files(corpus))
    sentences, fairseq_source_tokens = fairseq_tokens((work / "fairseq.log").read_text(), source)
    counts = json.loads((work / "vaswani.log").read_text().strip().splitlines()[-1])
    both = {key: rows["bpe"][key] + rows["fairseq"][key] for key in ("wall_seconds", "cpu_seconds")}
    both |= {key: max(rows["bpe"][key], rows["fairseq"][key]) for key in ("peak_rss", "peak_anon")}
    rows["bpe + fairseq"] = both | {"bytes": rows["fairseq"]["bytes"]}  # what training reads; the BPE text is input
    for row in rows.values():
        row["pairs_per_second_per_worker"] = train_pairs / row["wall_seconds"] / args.workers
    return {
        **harness.environment("datasets", "tokenizers", "transformers"),
        "corpus": str(corpus),
        "tokenizer": str(args.tokenizer),
        "train_pairs": train_pairs,
        "workers": args.workers,
        "fairseq_arguments": " ".join(fairseq[3:]),  # after `PYTHON -m fairseq_cli.preprocess`
        "train_source_tokens": {"fairseq": fairseq_source_tokens, "vaswani": counts["train_source_tokens"]},
        "train_sentences": {"fairseq": sentences, "vaswani": counts["train_pairs"]},
        "rows": rows,
    }


def render(result):
    cells = []
    for key, name in STEPS.items():
        row = result["rows"][key]
        memory = [f"{row[figure] / 1e9:.2f} GB" for figure in ("peak_rss", "peak_anon", "bytes")]
        seconds = [f"{row['wall_seconds']:.0f} s", f"{row['cpu_seconds']:.0f} s"]
        cells.append([name, *seconds, f"{row['pairs_per_second_per_worker']:,.0f}", *memory])
    header = ["step", "wall", "CPU", "train pairs / s / worker", "peak RSS, all processes", "peak anonymous, all"]
    tokens, sentences = result["train_source_tokens"], result["train_sentences"]
    lines = [
        "# vaswani's tokenization beside fairseq-preprocess",
        "",
        f"Written by `python -m benchmarks.preprocess` (docs/benchmarks/README.md says how each figure is measured); "
        f"{harness.describe(result)}: {result['train_pairs']:,} train pairs of `{result['corpus']}` with the BPE of "
        f"`{result['tokenizer']}`, {result['workers']} workers each.",
        "",
        harness.table([*header, "on disk"], cells),
        "",
        f"The same BPE: the train split's source side is {tokens['fairseq']:,} tokens in fairseq's log and "
        f"{tokens['vaswani']:,} in vaswani's ids (</s> included; sentences: {sentences['fairseq']:,} and "
        f"{sentences['vaswani']:,}, vaswani leaving out pairs longer than 256 tokens).",
        "",
        f"fairseq: `fairseq-preprocess {result['fairseq_arguments']}`. On disk: fairseq's binarised splits and "
        "dictionary; vaswani's Arrow cache next to each split (its input, the DatasetDict, is what both read).",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", nargs="?", choices=["compare", "bpe", "vaswani"], default="compare")
    parser.add_argument("--corpus", type=Path, required=True, help="a DatasetDict folder (scripts/prepare_data.py)")
    parser.add_argument("--tokenizer", required=True, help="its shared BPE (scripts/train_tokenizer.py)")
    parser.add_argument("--workdir", type=Path, required=True, help="the BPE text and fairseq's output (replaced)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fairseq_python", default=".fairseq-venv/bin/python", help="a Python with fairseq")
    parser.add_argument("--languages", nargs=2, default=["en", "es"], help="source and target (default: en es)")
    parser.add_argument("--output", default="docs/benchmarks/preprocess", help="OUTPUT.json and OUTPUT.md")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.step == "bpe":
        return write_bpe(args.corpus, args.tokenizer, args.workdir / "bpe", args.workers, args.languages)
    if args.step == "vaswani":
        return tokenize_for_training(args.corpus, args.tokenizer, args.workers, args.languages)
    result = compare(args)
    harness.write_page(args.output, result, render(result))
    return result


if __name__ == "__main__":
    main()
