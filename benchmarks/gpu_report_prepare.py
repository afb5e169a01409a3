"""GPU report, step 1 of 3: a folder that lets a GPU machine without network access measure the report.

    python -m benchmarks.gpu_report_prepare [--dataset_dir outputs/main_job/data]
                                            [--tokenizer outputs/main_job/tokenizer] [--carry_dir .gpu_carry]

Run from the root of a checkout, on a machine with the `test` extra installed and a package index in reach. It
writes into --carry_dir:
- corpus/: the training pairs of --dataset_dir tokenized with --tokenizer into numpy arrays (train.npz: each side's
  ids end to end and their offsets), the first --test_pairs test pairs as text (test.json) and the tokenizer: what
  the time_to_bleu section of `benchmarks.gpu_report_measure` trains and scores on (scripts/main_job.sh makes the
  default corpus and tokenizer);
- wheels/: the wheels of --packages at the versions installed here, with their dependencies, for --python_version
  on manylinux x86_64, less those whose names start with one of --leave_out (wheels the GPU machine already has);
- setup.sh: run on the GPU machine from the checkout's root, it installs the wheels, then this checkout (editable,
  without dependencies).
Then carry the folder and the checkout to the GPU machine and run `benchmarks.gpu_report_measure` there.
--corpus_only writes corpus/ alone.
"""

import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vaswani.training.checks import UsageError
from vaswani.training.cli import command, parse_arguments


@dataclass
class PrepareArguments:
    dataset_dir: str = field(default="outputs/main_job/data", metadata={"help": "the translation dataset"})
    tokenizer: str = field(default="outputs/main_job/tokenizer", metadata={"help": "its tokenizer"})
    source_lang: str = "en"
    target_lang: str = "es"
    test_pairs: int = field(default=1000, metadata={"help": "test pairs written for BLEU"})
    carry_dir: str = field(default=".gpu_carry", metadata={"help": "where the corpus, wheels and setup.sh go"})
    corpus_only: bool = field(default=False, metadata={"help": "write the corpus alone: no wheels, no setup.sh"})
    # What the measuring sections import beyond torch and numpy; pytest and hypothesis run the correctness section.
    packages: list[str] = field(
        default_factory=lambda: [
            "transformers",
            "huggingface_hub",
            "tokenizers",
            "safetensors",
            "accelerate",
            "datasets",
            "sacrebleu",
            "sacremoses",
            "pytest",
            "hypothesis",
        ],
        metadata={"help": "packages whose installed versions are carried as wheels, with their dependencies"},
    )
    leave_out: list[str] = field(
        default_factory=lambda: ["numpy", "pyarrow", "pandas"],
        metadata={"help": "wheels left out (the GPU machine has them)"},
    )
    python_version: str = field(default="3.12", metadata={"help": "the GPU machine's Python"})
    max_mib: float = field(default=64, metadata={"help": "the most the folder may hold, in MiB (0: no limit)"})


def prepare_corpus(dataset_dir, tokenizer_dir, corpus_dir: Path, source_lang="en", target_lang="es", test_pairs=1000):
    """The training pairs tokenized into numpy arrays (ids and offsets), the first test pairs as text, and the
    tokenizer, in `corpus_dir`."""
    from vaswani.training.data import load_translation_dataset, tokenize_split
    from vaswani.training.evaluation import load_pairs
    from vaswani.training.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    split = tokenize_split(
        load_translation_dataset(dataset_dir, source_lang, target_lang, splits=("train",))["train"],
        tokenizer,
        source_lang,
        target_lang,
    )
    corpus_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for side, column in (("source", "input_ids"), ("target", "labels")):
        ids = split.pairs.data.column(column).combine_chunks()
        arrays[side] = ids.values.to_numpy().astype(np.int16 if len(tokenizer) < 2**15 else np.int32)
        arrays[f"{side}_offsets"] = ids.offsets.to_numpy()
    np.savez_compressed(corpus_dir / "train.npz", **arrays)
    sources, references, _ = load_pairs(dataset_dir, "test", source_lang, target_lang, max_samples=test_pairs)
    (corpus_dir / "test.json").write_text(
        json.dumps({"sources": sources.to_pylist(), "references": references.to_pylist()})
    )
    tokenizer.save_pretrained(corpus_dir / "tokenizer")
    return corpus_dir


def download_wheels(args, wheels: Path) -> list[str]:
    """The wheels of --packages (at the versions installed here) and their dependencies, less --leave_out; returns
    the requirements setup.sh installs."""
    wheels.mkdir(parents=True, exist_ok=True)
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in args.packages] + ["setuptools>=69"]
    abi = f"cp{args.python_version.replace('.', '')}"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", wheels]
        + ["--python-version", args.python_version, "--implementation", "cp"]
        + ["--abi", abi, "--abi", "abi3", "--abi", "none"]
        + [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
        + ["--platform=any", *requirements],
        check=True,
    )
    left_out = tuple(f"{name.replace('-', '_')}-" for name in args.leave_out)
    for wheel in wheels.iterdir():
        if wheel.name.startswith(left_out):
            wheel.unlink()
    return requirements


@command
def main(argv) -> dict:
    (args,) = parse_arguments([PrepareArguments], argv, description=__doc__.split("\n\n")[0])
    carry = Path(args.carry_dir)
    prepare_corpus(
        args.dataset_dir, args.tokenizer, carry / "corpus", args.source_lang, args.target_lang, args.test_pairs
    )
    if not args.corpus_only:
        requirements = download_wheels(args, carry / "wheels")
        quoted = " ".join(f"'{requirement}'" for requirement in requirements)
        (carry / "setup.sh").write_text(
            "#!/usr/bin/env bash\n"
            "# Run from the checkout's root: the carried wheels, then the checkout itself (no package index needed).\n"
            "set -euo pipefail\n"
            'carry=$(dirname "$0")\n'
            f'python3 -m pip install --quiet --no-index --find-links "$carry/wheels" {quoted}\n'
            "python3 -m pip install --quiet --no-deps --no-build-isolation -e .\n"
        )
    mib = sum(path.stat().st_size for path in carry.rglob("*") if path.is_file()) / 2**20
    if args.max_mib and mib > args.max_mib:
        raise UsageError(f"{carry} holds {mib:.1f} MiB, more than --max_mib {args.max_mib:g}")
    print(f"{carry}: {mib:.1f} MiB" + ("" if args.corpus_only else f"; on the GPU machine: bash {carry}/setup.sh"))
    return {"carry_dir": str(carry), "mib": mib}


if __name__ == "__main__":
    main()
