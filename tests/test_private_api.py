"""The installed package uses transformers, accelerate, datasets, huggingface_hub, tokenizers and torch through their
public names only, and plays no tricks on the import system: what a new release of a library may change without
notice is whatever this package takes from its insides.

Read from the source with `ast`, nothing imported: every file pyproject.toml installs. A private name (one leading
underscore, not a dunder) is touched when the package

- imports it, or imports from a private module, of one of those libraries (`from transformers.x import _y`,
  `import torch._dynamo`);
- reads or writes it on one of their modules (`torch._C`), on `super()`, or on any object when the package itself
  does not define that name (`model._valid_auto_compile_criteria`: the object is a library's), by attribute or by
  string (`getattr(weight, "_is_hf_initialized")`, `hasattr(tokenizer, "_x")`);
- defines it in a subclass of one of their classes where the library defines it too (an override of a private
  method or attribute).

and when it uses the import system's hooks (`IMPORT_SYSTEM`: a finder on sys.meta_path, a module loaded from a file by
path, a write into sys.modules). Allowed are the names transformers documents for the authors of models and pipelines
(`DOCUMENTED`), and the entries of `ALLOWED`, each with its reason; an entry nothing needs any more fails too, so that
the lists only shrink.
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from vaswani.modeling.generation_vaswani import TORCH_PRIVATE_NAMES, TRANSFORMERS_PRIVATE_NAMES


tomllib = pytest.importorskip("tomllib")  # Python 3.11+

LIBRARIES = ("transformers", "accelerate", "datasets", "huggingface_hub", "tokenizers", "torch")

# Private names that transformers documents for the code it calls back: a model, a configuration or a pipeline class
# defines or reads them as its guides say.
DOCUMENTED = {
    "_init_weights": "PreTrainedModel: each module's weight initialisation, the hook the model-adding guide names",
    "_no_split_modules": "PreTrainedModel: the layers device_map='auto' keeps on one device",
    "_supports_sdpa": "PreTrainedModel: the attention implementations the model supports",
    "_supports_flash_attn": "PreTrainedModel: the attention implementations the model supports",
    "_supports_flex_attn": "PreTrainedModel: the attention implementations the model supports",
    "_can_compile_fullgraph": "PreTrainedModel: whether generate() may compile the forward whole",
    "_can_record_outputs": "PreTrainedModel: the layers whose outputs @capture_outputs collects ('Tracing model "
    "intermediate outputs')",
    "_attn_implementation": "PreTrainedConfig: the attention implementation a model's forward dispatches on",
    "_sanitize_parameters": "Pipeline: a method every pipeline implements ('Adding a new pipeline')",
    "_forward": "Pipeline: a method every pipeline implements ('Adding a new pipeline')",
    **dict.fromkeys(
        (
            "_load_tokenizer",
            "_load_processor",
            "_load_image_processor",
            "_load_video_processor",
            "_load_feature_extractor",
        ),
        "Pipeline: the components pipeline() loads, which the base class's comment asks subclasses to set",
    ),
}

# (file, name): why this file still touches this private name (or import hook). Remove an entry with its use.
ALLOWED = {
    **{
        ("modeling/generation_vaswani.py", name.split(".")[-1]): reason
        for name, reason in {**TRANSFORMERS_PRIVATE_NAMES, **TORCH_PRIVATE_NAMES}.items()
    },
    ("training/data.py", "_switch_to_target_mode"): "the one sign that a tokenizer encodes targets otherwise than "
    "sources (Marian, NLLB), where the fast path of token_ids would give source ids for targets",
}

IMPORT_SYSTEM = {
    "meta_path",
    "path_hooks",
    "path_importer_cache",
    "spec_from_file_location",
    "spec_from_loader",
    "module_from_spec",
    "exec_module",
    "SourceFileLoader",
    "MetaPathFinder",
    "PathEntryFinder",
}


STRING_ACCESS = {"getattr", "hasattr", "setattr", "delattr"}


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def installed_files():
    """The package's Python files as pyproject.toml installs them: each package's folder, and the package data."""
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    files = []
    for package in setuptools["packages"]:
        top, *rest = package.split(".")
        files += sorted((REPO_ROOT / folders.get(top, top)).joinpath(*rest).glob("*.py"))
    for patterns in setuptools.get("package-data", {}).values():
        files += sorted(path for pattern in patterns if pattern.endswith(".py") for path in REPO_ROOT.glob(pattern))
    return files


class LibrarySource:
    """The private names a library's source defines (`def _x(`, `_x = ...`), read without importing it: `find_spec`
    of a top-level package only locates its folder."""

    DEFINITION = re.compile(r"^\s*(?:def (_\w+)\(|(_\w+)\s*(?::[^=\n]*)?=)", re.M)

    def __init__(self):
        self.names = {}

    def defines(self, dotted, name):
        """Whether the library source under the deepest folder of `dotted` (`torch.nn.Module`: torch/nn/) defines
        `name`; transformers' models/ (one folder per model) left out."""
        top, *rest = dotted.split(".")
        spec = importlib.util.find_spec(top)
        if spec is None or not spec.submodule_search_locations:
            return False
        folder = Path(spec.submodule_search_locations[0])
        for part in rest:
            if not (folder / part).is_dir():
                break
            folder = folder / part
        if folder not in self.names:
            files = (path for path in folder.rglob("*.py") if "models" not in path.relative_to(folder).parts[:1])
            text = "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in files)
            self.names[folder] = {a or b for a, b in self.DEFINITION.findall(text)}
        return name in self.names[folder]


def bindings_of(tree):
    """name -> the dotted path of what an absolute import bound to it, anywhere in the module."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def dotted_origin(node, bound):
    """The dotted path an expression names through the module's imports (`nn.functional` -> torch.nn.functional)."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted_origin(node.value, bound)
        return f"{base}.{node.attr}" if base else None
    return None


def own_private_names(trees):
    """The private names the package defines: functions, classes, module and class variables, `self._x`."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
    return {name for name in names if is_private(name)}


def library_bases(tree, bound):
    """class name -> the dotted paths of the library classes it derives from (through the module's own classes)."""
    bases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found = []
            for base in node.bases:
                origin = dotted_origin(base, bound)
                if origin and origin.split(".")[0] in LIBRARIES:
                    found.append(origin)
                elif isinstance(base, ast.Name):
                    found += bases.get(base.id, [])
            bases[node.name] = found
    return bases


def touches(path, tree, own, libraries):
    """(line, name, what) for each private name of the libraries that the file touches, and each import trick."""
    bound = bindings_of(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if node.__dict__.get("level", 0) == 0 and module.split(".")[0] in LIBRARIES:
                    found += [(node.lineno, part, "private module") for part in module.split(".") if is_private(part)]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in LIBRARIES:
                found += [(node.lineno, alias.name, "imported") for alias in node.names if is_private(alias.name)]
        elif isinstance(node, ast.Attribute):
            if node.attr in IMPORT_SYSTEM:
                found.append((node.lineno, node.attr, "import system"))
            if not is_private(node.attr):
                continue
            origin = dotted_origin(node.value, bound)
            receiver = node.value
            if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
                found.append((node.lineno, node.attr, "on super()"))
            elif origin is not None:
                if origin.split(".")[0] in LIBRARIES:
                    found.append((node.lineno, node.attr, f"on {origin}"))
            elif node.attr not in own:
                found.append((node.lineno, node.attr, "on a library's object"))
        elif isinstance(node, ast.Name) and node.id in IMPORT_SYSTEM:
            found.append((node.lineno, node.id, "import system"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in STRING_ACCESS:
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and is_private(name.value):
                if name.value not in own:
                    found.append((node.lineno, name.value, f"by {node.func.id}()"))
        elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
            if dotted_origin(node.value, bound) == "sys.modules":
                found.append((node.lineno, "sys.modules", "import system"))
    bases = library_bases(tree, bound)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            derived = bases[node.name]
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [(item.lineno, item.name)]
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names = [(item.lineno, target.id) for target in targets if isinstance(target, ast.Name)]
                else:
                    continue
                for line, name in names:
                    if is_private(name) and any(libraries.defines(base, name) for base in derived):
                        found.append((line, name, f"overrides {node.name}'s library base"))
    return sorted(set(found))


@pytest.fixture(scope="module")
def findings():
    """(file, line, name, what) for every private name touched, over the installed files."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in installed_files()}
    own, libraries = own_private_names(trees.values()), LibrarySource()
    return [
        (path.relative_to(REPO_ROOT).as_posix(), line, name, what)
        for path, tree in trees.items()
        for line, name, what in touches(path, tree, own, libraries)
    ]


def test_the_files_read_are_those_pyproject_installs():
    files = {path.relative_to(REPO_ROOT).as_posix() for path in installed_files()}
    assert {"__init__.py", "cli.py", "modeling/modeling_vaswani.py", "hub/push.py", "scripts/train.py"} <= files
    assert "metrics/vaswani_bleu/vaswani_bleu.py" in files and not any(f.startswith("tests/") for f in files)


def test_no_private_name_of_the_libraries_and_no_import_hook_outside_the_allowlists(findings):
    unexpected = [
        f"{file}:{line}: {name} ({what})"
        for file, line, name, what in findings
        if (file, name) not in ALLOWED and (what == "import system" or name not in DOCUMENTED)
    ]
    assert unexpected == [], "\n".join(unexpected)


def test_every_allowlist_entry_is_still_needed(findings):
    used = {(file, name) for file, _, name, _ in findings}
    assert [entry for entry in ALLOWED if entry not in used] == []
    assert [name for name in DOCUMENTED if name not in {name for _, name in used}] == []
