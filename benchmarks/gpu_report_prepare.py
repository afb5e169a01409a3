"""GPU report, step 1 of 2: the folder that lets a GPU machine without network access make the whole report in one
command.

    python -m benchmarks.gpu_report_prepare [--dataset_dir outputs/main_job/data]
                                            [--tokenizer outputs/main_job/tokenizer] [--carry_dir .gpu_carry]
    # step 2, on the GPU machine, from the root of the checkout, with the checkout and the folder carried there:
    bash .gpu_carry/run.sh OUTPUT_DIR

Needs a package index. Writes into --carry_dir (at most --max_mib): corpus/ (the training pairs as numpy arrays, the
first test pairs, the tokenizer); wheels/ (what the report needs and the machine lacks, GPU_MACHINE_PACKAGES being
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


# The GPU machine the report is measured on: CPython 3.12.3 (its `python3`), torch 2.11.0 built for CUDA 13, and the
# packages below, as its `pip list` read them in November 2026: a version where one was read, None where only the name
# was (taken to be a version the report accepts: `--check` verifies that on the machine before it measures).
GPU_MACHINE_PYTHON = "3.12"
GPU_MACHINE_PACKAGES = {
    **dict.fromkeys(
        """absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi charset-normalizer
        chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit
        cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
        frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig
        interface-meta jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
        llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
        multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda nvidia-cublas
        nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
        nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
        nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
        packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil
        pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark
        pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pyyaml regex requests rich sacrebleu
        scikit-build-core scikit-image scikit-learn scipy seaborn setuptools shellingham simplejson six
        sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
        tifffile timm toolz tqdm treescope typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
        werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
    ),
    "accelerate": "1.15.0",
    "botorch": "0.18.1",
    "cupy-cuda13x": "14.2.0",
    "huggingface-hub": "1.33.0",
    "jax": "0.11.2",
    "jax-cuda13-pjrt": "0.11.2",
    "jax-cuda13-plugin": "0.11.2",
    "jaxlib": "0.11.2",
    "jaxtyping": "0.3.11",
    "numpy": "2.5.2",
    "numpyro": "0.21.0",
    "onnx": "1.23.1",
    "onnx-ir": "1.0.0",
    "onnxruntime": "1.30.0",
    "onnxscript": "0.7.2",
    "pytorch-lightning": "2.6.6",
    "safetensors": "0.8.0",
    "sentence-transformers": "6.0.1",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torch-geometric": "2.8.0.post1",
    "torchaudio": "2.11.0",
    "torchdiffeq": "0.2.5",
    "torchmetrics": "1.9.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
# What the report runs with beyond the package's own requirements, from its extras (their ranges): the training
# measurement's Accelerator, sacreBLEU for time_to_bleu, matplotlib for the page, pytest for the GPU tests.
REPORT_PACKAGES = ("accelerate", "sacrebleu", "matplotlib", "pytest")


def never_carried(name: str) -> bool:
    """torch and the CUDA libraries it is built with: the machine's own, or the report cannot run there."""
    return name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-"))


@dataclass
class PrepareArguments:
    dataset_dir: str = field(default="outputs/main_job/data", metadata={"help": "the translation dataset"})
    tokenizer: str = field(default="outputs/main_job/tokenizer", metadata={"help": "its tokenizer"})
    source_lang: str = "en"
    target_lang: str = "es"
    test_pairs: int = field(default=1000, metadata={"help": "test pairs written for BLEU"})
    carry_dir: str = field(default=".gpu_carry", metadata={"help": "where the corpus, wheels and run.sh go"})
    python_version: str = field(
        default=GPU_MACHINE_PYTHON, metadata={"help": "the Python the wheels are for (the GPU machine's)"}
    )
    max_mib: float = field(default=64, metadata={"help": "the most the folder may hold, in MiB (0: no limit)"})
    check: bool = field(
        default=False, metadata={"help": "only check that this environment meets --carry_dir's requirements.json"}
    )


def prepare_corpus(dataset_dir, tokenizer_dir, corpus_dir: Path, source_lang="en", target_lang="es", test_pairs=1000):
    """The training pairs tokenized into numpy arrays (ids and offsets), the first test pairs as text, and the
    tokenizer, in `corpus_dir`."""
    from vaswani.corpora.tokenizer import load_tokenizer
    from vaswani.evaluation.bleu import load_pairs
    from vaswani.training.data import load_translation_dataset, tokenize_split

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


class CarriedPairs:
    """The training pairs `prepare_corpus` wrote (train.npz: each side's ids end to end, and their offsets), indexed
    by a batch's rows: `pairs[rows]` is the model's inputs for those pairs (`pair_batch`, as `PairCollator` pads the
    Arrow pairs). A map-style dataset of torch's DataLoader."""

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

        ids = {
            side: np.concatenate([self.ids[side][self.offsets[side][r] : self.offsets[side][r + 1]] for r in rows])
            for side in ("source", "target")
        }
        lengths = self.lengths["source"][rows], self.lengths["target"][rows]
        return pair_batch(
            ids["source"], lengths[0], ids["target"], lengths[1], self.pad_token_id, self.decoder_start_token_id
        )


def report_requirements() -> list[Requirement]:
    """What the report needs installed: the checkout's base requirements (pyproject.toml), REPORT_PACKAGES with the
    ranges its extras give them."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    in_extras = {}
    for lines in project["optional-dependencies"].values():
        for line in lines:
            requirement = Requirement(line)
            in_extras.setdefault(canonicalize_name(requirement.name), requirement)
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


def target_environment(python_version: str, extra: str = "") -> dict:
    """Environment markers as the wheels' Python evaluates them: CPython `python_version` on Linux x86_64."""
    return default_environment() | {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "extra": extra,
    }


def carried_packages(requirements: list[Requirement], python_version: str) -> tuple[dict, list[str]]:
    """The packages to carry, {name: the version installed here, which the tests ran with}, and the requirements left
    to the GPU machine: `requirements` followed through the dependencies of each carried package (their markers as
    `python_version` on Linux evaluates them), stopping at those the machine meets."""
    carried, left_to_machine, seen = {}, set(), set()
    pending = [(requirement, "") for requirement in requirements]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(
            target_environment(python_version, extra)
        ):
            continue
        name = canonicalize_name(requirement.name)
        if on_the_machine(requirement):
            left_to_machine.add(str(Requirement(f"{name}{requirement.specifier}")))
            continue
        if never_carried(name):
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
    """The wheels of `carried` ({name: version}) alone, without their dependencies, for CPython `python_version` on
    manylinux x86_64 (any glibc from 2.5 to 2.39); the wheels' file names."""
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
        raise UsageError(
            f"{carry} holds no requirements.json: make it with `python -m benchmarks.gpu_report_prepare`."
        )
    requirements = json.loads(record.read_text())
    lines = requirements["left_to_machine"] + [f"{n}=={v}" for n, v in requirements["carried"].items()]
    problems = [f"{line} ({why})" for line in lines if (why := unmet(Requirement(line)))]
    if problems:
        raise UsageError(
            f"this Python ({sys.executable}) does not meet what {carry} was prepared for: {'; '.join(problems)}. "
            "Carry those packages (GPU_MACHINE_PACKAGES in benchmarks/gpu_report_prepare.py says what the machine has)."
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
