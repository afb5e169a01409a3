"""GPU report, step 1 of 2: the folder a GPU machine without network access needs to make the report.

    python -m benchmarks.gpu_report_prepare [--dataset_dir outputs/main_job/data]
                                            [--tokenizer outputs/main_job/tokenizer] [--carry_dir .gpu_carry]
    # step 2, on the GPU machine, from the root of the checkout, with the checkout and the folder carried there:
    bash .gpu_carry/run.sh OUTPUT_DIR [--part 2]

Needs a package index. Writes into --carry_dir (at most --max_mib): corpus/ (the training pairs as numpy arrays, the
first test pairs, the tokenizer); wheels/ (what the report needs and the machine lacks, gpu_machine_packages.txt being
what it has; never torch or CUDA's); build/ (what builds the checkout); requirements.json (what is left to the
machine, which `--check` verifies there); run.sh.
"""

import importlib.metadata
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.harness import REPO, folder_bytes
from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments
from vaswani.scripts.train import NEEDS


# The GPU machine the report is measured on: CPython 3.12.3 (its `python3`), torch 2.11.0 built for CUDA 13, and the
# packages of gpu_machine_packages.txt, as its `pip list --format=freeze` read them on 2026-12-04 (names normalised):
# NAME==VERSION, or the name alone where no version was read (taken to be one the report accepts: `--check` verifies
# that on the machine). `python3 -m pip list --format=freeze` there gives the file anew.
GPU_MACHINE_PYTHON = "3.12"
LISTING = Path(__file__).with_name("gpu_machine_packages.txt").read_text().split()
GPU_MACHINE_PACKAGES = {
    canonicalize_name(name): version or None for name, _, version in (entry.partition("==") for entry in LISTING)
}
# What the report runs with beyond the package's own requirements, from its extras (their ranges): what
# vaswani-train needs (the GPU tests train with it; the training measurement's Accelerator, sacreBLEU for
# time_to_bleu), matplotlib for the page, pytest and pytest-xdist for the GPU tests.
REPORT_PACKAGES = (*NEEDS, "matplotlib", "pytest", "pytest-xdist")


@dataclass
class PrepareArguments:
    dataset_dir: str = field(default="outputs/main_job/data", metadata={"help": "the translation dataset"})
    tokenizer: str = field(default="outputs/main_job/tokenizer", metadata={"help": "its tokenizer"})
    source_lang: str = "en"
    target_lang: str = "es"
    test_pairs: int = field(default=1000, metadata={"help": "test pairs written for BLEU"})
    carry_dir: str = field(default=".gpu_carry", metadata={"help": "where the corpus, wheels and run.sh go"})
    python_version: str = field(default=GPU_MACHINE_PYTHON, metadata={"help": "the Python the wheels are for"})
    max_mib: float = field(default=64, metadata={"help": "the most the folder may hold, in MiB (0: no limit)"})
    check: bool = field(default=False, metadata={"help": "only check this Python against the carry's requirements"})


def prepare_corpus(dataset_dir, tokenizer_dir, corpus_dir: Path, source_lang="en", target_lang="es", test_pairs=1000):
    """The training pairs tokenized into numpy arrays (ids and offsets), the first test pairs, the tokenizer."""
    from vaswani.corpora.tokenizer import load_tokenizer
    from vaswani.evaluation.bleu import load_pairs
    from vaswani.training.data import load_translation_dataset, tokenize_split

    tokenizer = load_tokenizer(tokenizer_dir)
    train = load_translation_dataset(dataset_dir, source_lang, target_lang, splits=("train",))["train"]
    split = tokenize_split(train, tokenizer, source_lang, target_lang)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for side, column in (("source", "input_ids"), ("target", "labels")):
        ids = split.pairs.data.column(column).combine_chunks()
        arrays[side] = ids.values.to_numpy().astype(np.int16 if len(tokenizer) < 2**15 else np.int32)
        arrays[f"{side}_offsets"] = ids.offsets.to_numpy()
    np.savez_compressed(corpus_dir / "train.npz", **arrays)
    sources, references, _, _ = load_pairs(dataset_dir, "test", source_lang, target_lang, max_samples=test_pairs)
    test = {"sources": sources.to_pylist(), "references": references.to_pylist()}
    (corpus_dir / "test.json").write_text(json.dumps(test))
    tokenizer.save_pretrained(corpus_dir / "tokenizer")
    return corpus_dir


class CarriedPairs:
    """The pairs `prepare_corpus` wrote, a map-style dataset: `pairs[rows]` is the model's inputs for those rows."""

    def __init__(self, path, pad_token_id, decoder_start_token_id):
        arrays = np.load(path)
        self.ids = {side: arrays[side].astype(np.int64) for side in ("source", "target")}
        self.offsets = {side: arrays[f"{side}_offsets"] for side in ("source", "target")}
        self.lengths = {side: np.diff(offsets) for side, offsets in self.offsets.items()}
        self.pad_token_id, self.decoder_start_token_id = pad_token_id, decoder_start_token_id

    def __len__(self):
        return len(self.lengths["source"])

    def __getitem__(self, rows):
        from vaswani.training.padding import pair_batch

        def side(name):  # the rows' ids end to end, and their lengths
            ids, offsets = self.ids[name], self.offsets[name]
            return np.concatenate([ids[offsets[r] : offsets[r + 1]] for r in rows]), self.lengths[name][rows]

        return pair_batch(*side("source"), *side("target"), self.pad_token_id, self.decoder_start_token_id)


def report_requirements() -> list[Requirement]:
    """The checkout's base requirements (pyproject.toml) and REPORT_PACKAGES with the ranges its extras give them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [Requirement(line) for lines in project["optional-dependencies"].values() for line in lines]
    in_extras = {canonicalize_name(r.name): r for r in reversed(extras)}  # the first extra's range of each package
    missing = [name for name in REPORT_PACKAGES if name not in in_extras]
    if missing:
        raise UsageError(f"pyproject.toml's extras no longer name {', '.join(missing)}: update REPORT_PACKAGES.")
    return [Requirement(line) for line in project["dependencies"]] + [in_extras[name] for name in REPORT_PACKAGES]


def build_requirements() -> dict:
    """What builds the checkout (pyproject.toml's build-system), {name: the version installed here}."""
    pins = {}
    for line in tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]:
        requirement = Requirement(line)
        if why := unmet(requirement):
            raise UsageError(f"the checkout builds with {requirement}: install it here ({why})")
        pins[canonicalize_name(requirement.name)] = importlib.metadata.version(requirement.name)
    return pins


def unmet(requirement: Requirement) -> str | None:
    """Why this Python environment does not meet `requirement` ("none installed", "5.17.0 installed"), or None."""
    try:
        version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return "none installed"
    return None if requirement.specifier.contains(version, prereleases=True) else f"{version} installed"


def on_the_machine(requirement: Requirement) -> bool:
    """Whether the GPU machine has the package at a version the requirement accepts (a version not read counts)."""
    name = canonicalize_name(requirement.name)
    if name not in GPU_MACHINE_PACKAGES:
        return False
    version = GPU_MACHINE_PACKAGES[name]
    return version is None or requirement.specifier.contains(version, prereleases=True)


def carried_packages(requirements: list[Requirement], python_version: str) -> tuple[dict, list[str]]:
    """The packages to carry, {name: the version installed here}, and the requirements left to the GPU machine:
    `requirements` followed through each carried package's dependencies, stopping at those the machine meets."""
    target = default_environment() | {  # the markers as the wheels' Python evaluates them: CPython on Linux x86_64
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
    }
    carried, left_to_machine, seen = {}, set(), set()
    pending = [(requirement, "") for requirement in requirements]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(target | {"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        if on_the_machine(requirement):
            left_to_machine.add(str(Requirement(f"{name}{requirement.specifier}")))
            continue
        if name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-")):  # torch and CUDA: the machine's
            raise UsageError(
                f"the GPU machine's {name} {GPU_MACHINE_PACKAGES.get(name)} does not meet {requirement}, and "
                f"{name} is never carried: the package's range must accept the machine's."
            )
        if why := unmet(requirement):
            raise UsageError(f"the report carries {requirement}: install it here ({why})")
        carried[name] = importlib.metadata.version(name)
        for wanted in {""} | requirement.extras:
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                pending += [(Requirement(line), wanted) for line in importlib.metadata.requires(name) or []]
    return carried, sorted(left_to_machine)


def download_wheels(carried: dict, wheels: Path, python_version: str) -> list[str]:
    """The wheels of `carried` ({name: version}), no dependencies, for CPython `python_version` on manylinux x86_64
    (glibc 2.5 to 2.39); their file names."""
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    if not carried:
        return []
    abi = f"cp{python_version.replace('.', '')}"
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "any"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", wheels]
        + ["--python-version", python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3"]
        + ["--abi", "none", *(f"--platform={platform}" for platform in platforms)]
        + [f"{name}=={version}" for name, version in sorted(carried.items())],
        check=True,
    )
    return sorted(path.name for path in wheels.glob("*.whl"))


def check_environment(carry: Path):
    """Refuse an environment that does not meet what the carry leaves to it and the wheels it carried."""
    record = carry / "requirements.json"
    if not record.is_file():
        raise UsageError(f"{carry} holds no requirements.json: make it with `python -m benchmarks.gpu_report_prepare`")
    requirements = json.loads(record.read_text())
    lines = requirements["left_to_machine"] + [f"{n}=={v}" for n, v in requirements["carried"].items()]
    problems = [f"{line} ({why})" for line in lines if (why := unmet(Requirement(line)))]
    if problems:
        raise UsageError(
            f"this Python ({sys.executable}) does not meet what {carry} was prepared for: {'; '.join(problems)}. "
            "Carry those packages (benchmarks/gpu_machine_packages.txt says what the machine has)."
        )
    print(f"{sys.executable} meets {carry}'s {len(requirements['left_to_machine'])} requirements and its wheels")


@command
def main(argv) -> dict:
    (args,) = parse_arguments([PrepareArguments], argv, description=__doc__.split("\n\n")[0])
    carry = Path(args.carry_dir)
    if args.check:
        check_environment(carry)
        return {}
    prepare_corpus(
        args.dataset_dir, args.tokenizer, carry / "corpus", args.source_lang, args.target_lang, args.test_pairs
    )
    carried, left_to_machine = carried_packages(report_requirements(), args.python_version)
    wheels = download_wheels(carried, carry / "wheels", args.python_version)
    download_wheels(build_requirements(), carry / "build", args.python_version)
    named = sorted(set(carried) | {Requirement(line).name for line in left_to_machine})
    record = {
        "python": args.python_version,
        "carried": carried,
        "left_to_machine": left_to_machine,
        "machine_versions": {name: GPU_MACHINE_PACKAGES.get(name) for name in named},
    }
    (carry / "requirements.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.copyfile(Path(__file__).with_name("gpu_report_run.sh"), carry / "run.sh")
    result = {"carry_dir": str(carry), "wheels": wheels, **record}
    result["mib"] = mib = folder_bytes([carry]) / 2**20
    if args.max_mib and mib > args.max_mib:
        raise UsageError(f"{carry} holds {mib:.1f} MiB, more than --max_mib {args.max_mib:g}")
    parts = ", ".join(
        f"{part.name} {folder_bytes([part]) / 2**20:.1f} MiB" for part in sorted(carry.iterdir()) if part.is_dir()
    )
    print(f"{carry}: {mib:.1f} MiB ({parts}); wheels carried: {', '.join(wheels) or 'none'}")
    print(f"on the GPU machine, from the checkout's root: bash {carry}/run.sh OUTPUT_DIR")
    return result


if __name__ == "__main__":
    main()
