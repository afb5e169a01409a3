"""The whole model on ONNX Runtime (docs/exports.md, "ONNX"): `vaswani.export.onnx.export` writes the encoder and the
decoder's steps with their caches, with dynamic batch and length axes, and the folder's translate.py translates as
greedy `generate()` does, in a Python environment that has no torch."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import PAIRS, docs_block

from vaswani.evaluation.bleu import translate


pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")
pytestmark = [
    pytest.mark.slow,  # three ONNX exports, about 30 s on 2 shared cores
    # torch's ONNX exporter checks its tree specs the old way, and warns about it: its business, not the model's.
    pytest.mark.filterwarnings(r"default:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning"),
]

# Sentences of unequal lengths, one the model never saw, a blank line; batches of 2 and 3 cut them unevenly.
SENTENCES = [PAIRS[2][0], "", PAIRS[0][0], "And God saw the light.", PAIRS[3][0], PAIRS[1][0]]


@pytest.fixture(scope="module")
def exported(trained_text_model, tmp_path_factory):
    """The docs' export, run on the trained model in place of the main job's."""
    model, tokenizer, folder = trained_text_model
    work = tmp_path_factory.mktemp("onnx")
    (work / "outputs" / "main_job").mkdir(parents=True)
    (work / "outputs" / "main_job" / "model").symlink_to(folder)
    snippet = docs_block("docs/exports.md", "## ONNX").replace('"onnx-model"', f'"{work / "onnx-model"}"')
    exec(snippet.replace('"outputs/main_job/model"', f'"{folder}"'), {})
    return model, tokenizer, work / "onnx-model"


def test_the_export_translates_as_greedy_generate_does_at_any_batch_and_length(exported):
    model, tokenizer, folder = exported
    assert {path.name for path in folder.iterdir()} >= {"encoder.onnx", "decoder_start.onnx", "decoder_step.onnx",
                                                        "tokenizer.json", "onnx_config.json", "translate.py"}  # fmt: skip
    spec = importlib.util.spec_from_file_location("onnx_translate", folder / "translate.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    translator = runner.OnnxTranslator(folder, threads=1)
    expected = translate(model, tokenizer, SENTENCES, num_beams=1)
    assert expected[0] == PAIRS[2][1] and expected[1] == ""
    for batch_size in (2, 3):
        assert translator.translate(SENTENCES, batch_size=batch_size) == expected


def test_the_export_translates_where_torch_is_not_installed(exported, tmp_path):
    """A virtual environment with numpy, onnxruntime and tokenizers alone (linked from this one's): importing torch
    fails there, and translate.py reads standard input and writes standard output."""
    model, tokenizer, folder = exported
    packages = tmp_path / "packages"
    packages.mkdir()
    for name in ("numpy", "onnxruntime", "tokenizers"):
        home = Path(importlib.util.find_spec(name).origin).parent
        for path in home.parent.glob(f"{name}*"):  # the package, its vendored libraries (numpy.libs), its metadata
            (packages / path.name).symlink_to(path)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    environment = {"PYTHONPATH": str(packages), "PATH": "/usr/bin:/bin"}
    no_torch = subprocess.run([python, "-c", "import torch"], env=environment, capture_output=True, text=True)
    assert "No module named 'torch'" in no_torch.stderr
    done = subprocess.run(
        [python, folder / "translate.py", folder, "--batch_size", "2"],
        input="".join(sentence + "\n" for sentence in SENTENCES),
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == translate(model, tokenizer, SENTENCES, num_beams=1)
