"""What `pip install vaswani` brings: the model and nothing it does not need at inference; the rest in extras."""

import ast
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from packaging.requirements import Requirement


BASE = {"torch", "transformers", "safetensors", "huggingface-hub", "tokenizers", "tqdm", "ninja"}


def requirements():
    return [Requirement(line) for line in importlib.metadata.requires("vaswani")]


def test_the_base_install_is_what_the_model_needs_at_inference():
    base = {requirement.name.replace("_", "-") for requirement in requirements() if requirement.marker is None}
    assert base == BASE


def test_the_model_imports_only_the_base_install():
    """configuration/, modeling/ and the package's own modules (its __init__, lazy_imports, checks, cli) import the
    standard library, the base install and themselves: `import vaswani` works without any extra."""
    allowed = {name.replace("-", "_") for name in BASE} | set(sys.stdlib_module_names)
    files = [
        *sorted(REPO_ROOT.glob("*.py")),
        *sorted((REPO_ROOT / "configuration").glob("*.py")),
        *(REPO_ROOT / "modeling").glob("*.py"),
    ]
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{file.name} imports {name}"


def test_each_extra_holds_what_its_commands_import():
    extras = {}
    for requirement in requirements():
        if requirement.marker is not None:
            extra = str(requirement.marker).split('"')[1]
            extras.setdefault(extra, set()).add(requirement.name)
    assert {"accelerate", "datasets", "sacrebleu", "matplotlib", "tensorboard"} <= extras["train"]
    assert {"datasets", "pysword"} <= extras["data"]
    assert "jinja2" in extras["hub"] and "ctranslate2" in extras["export"]
    assert (
        "evaluate" in extras["train"]
    )  # the BLEU metric module (metrics/vaswani_bleu) that every command scores with


def test_the_package_holds_no_development_tools():
    """The benchmarks, the GPU report and the studies behind docs/benchmarks/ live in benchmarks/, run from a
    checkout: pyproject.toml packages none of it and has no console script for it, and no installed module is one."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    assert "benchmarks" not in {name.split(".")[-1] for name in packages}
    assert not [name for name, target in config["project"]["scripts"].items() if "benchmark" in name + target]
    tool = re.compile(r"benchmark|gpu_report|data_scale|learning_curves")
    for package in packages:
        folder = REPO_ROOT.joinpath(*package.split(".")[1:])
        assert not [path.name for path in folder.glob("*.py") if tool.search(path.stem)], package
    for module in ("vaswani.scripts.benchmark", "vaswani.scripts.gpu_report"):
        assert importlib.util.find_spec(module) is None, module


def test_the_tests_import_the_installed_package_once():
    """pytest must not import the repository root as a package of its own (pyproject.toml's --confcutdir): the Auto
    classes would then map "vaswani" to that second copy's classes."""
    from transformers import AutoConfig

    import vaswani

    roots = [name for name, module in list(sys.modules.items())
             if getattr(module, "__file__", None) and Path(module.__file__).resolve() == Path(vaswani.__file__).resolve()]  # fmt: skip
    assert roots == ["vaswani"]
    assert type(AutoConfig.for_model("vaswani")) is vaswani.VaswaniConfig
