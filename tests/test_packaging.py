"""What `pip install vaswani` brings: the model and nothing it does not need at inference; the rest in extras."""

import ast
import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement


ROOT = Path(__file__).resolve().parent.parent
BASE = {"torch", "transformers", "safetensors", "huggingface-hub", "tokenizers"}


def requirements():
    return [Requirement(line) for line in importlib.metadata.requires("vaswani")]


def test_the_base_install_is_what_the_model_needs_at_inference():
    base = {requirement.name.replace("_", "-") for requirement in requirements() if requirement.marker is None}
    assert base == BASE


def test_the_model_imports_only_the_base_install():
    """configuration/, modeling/ and the package's __init__ import the standard library, the base install and
    themselves: `import vaswani` works without any extra."""
    allowed = {name.replace("-", "_") for name in BASE} | set(sys.stdlib_module_names)
    files = [ROOT / "__init__.py", *sorted((ROOT / "configuration").glob("*.py")), *(ROOT / "modeling").glob("*.py")]
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
    assert "evaluate" not in set().union(*extras.values())  # BLEU is sacreBLEU, called directly (README)


def test_the_tests_import_the_installed_package_once():
    """pytest must not import the repository root as a package of its own (pyproject.toml's --confcutdir): the Auto
    classes would then map "vaswani" to that second copy's classes."""
    from transformers import AutoConfig

    import vaswani

    roots = [name for name, module in list(sys.modules.items())
             if getattr(module, "__file__", None) and Path(module.__file__).resolve() == Path(vaswani.__file__).resolve()]  # fmt: skip
    assert roots == ["vaswani"]
    assert type(AutoConfig.for_model("vaswani")) is vaswani.VaswaniConfig
