"""int8 on the CPU: torch's dynamic quantization of every linear layer (`vaswani-translate --int8`,
`vaswani-evaluate --int8`), and torchao's configs through `from_pretrained(quantization_config=...)`."""

import pytest
import torch
from helpers import PAIRS, exit_message
from transformers import AutoModelForSeq2SeqLM, TorchAoConfig

from vaswani.evaluation.bleu import int8_linear_layers, load_translation_model, translate
from vaswani.scripts import translate as translate_command


SOURCES = [source for source, _ in PAIRS]
TARGETS = [target for _, target in PAIRS]


def test_every_linear_layer_quantizes_under_dynamic_quantization(tiny_model):
    """The query, key and value projections too: quantize_dynamic replaces modules whose type is exactly nn.Linear."""
    names = [name for name, module in tiny_model.named_modules() if type(module) is torch.nn.Linear]
    assert any(name.endswith("q_proj") for name in names) and any(name.endswith("v_proj") for name in names)
    quantized = dict(int8_linear_layers(tiny_model.eval()).named_modules())
    assert {type(quantized[name]) for name in names} == {torch.ao.nn.quantized.dynamic.Linear}


def test_int8_translates_what_the_model_learnt_as_float32_does(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
    model, tokenizer = load_translation_model(folder, device="cpu", int8=True)
    assert not any(type(module) is torch.nn.Linear for module in model.modules())
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in SOURCES), encoding="utf-8")
    translate_command.main(["--model", str(folder), "--input", str(tmp_path / "in.txt"), "--output",
                            str(tmp_path / "out.txt"), "--int8"])  # fmt: skip
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == TARGETS


def test_int8_on_a_gpu_is_refused_by_name(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
    (tmp_path / "in.txt").write_text("Jesus wept.\n", encoding="utf-8")
    message = exit_message(translate_command.main, ["--model", folder, "--input", tmp_path / "in.txt", "--int8",
                                                    "--device", "cuda"])  # fmt: skip
    assert "int8 decoding runs on the CPU only" in message and "cuda" in message


def test_torchao_quantizes_every_linear_layer_through_from_pretrained_and_reloads(trained_text_model, tmp_path):
    """transformers keeps the output projection, tied to the embeddings, in float32; every other linear layer is
    torchao's int8 tensor, in the loaded model and in its saved and reloaded copy."""
    pytest.importorskip("torchao", reason="needs torchao (pip install torchao)")
    from torchao.quantization import Int8WeightOnlyConfig

    _, tokenizer, folder = trained_text_model
    config = TorchAoConfig(Int8WeightOnlyConfig())
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, quantization_config=config)

    def weight_types(model):
        return {type(module.weight).__name__ for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and name != "lm_head"}  # fmt: skip

    assert weight_types(model) == {"Int8Tensor"}
    assert translate(model, tokenizer, SOURCES) == TARGETS
    model.save_pretrained(tmp_path / "int8")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "int8")
    assert weight_types(reloaded) == {"Int8Tensor"}
    assert translate(reloaded, tokenizer, SOURCES) == TARGETS
