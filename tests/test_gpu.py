"""The model on a CUDA device, in bfloat16 and float16: what the CPU suite cannot show.

Marked `gpu`, so the default suite leaves them out: `python -m pytest -m gpu tests/test_gpu.py`. The device-independent
generation and numerics tests run on the device too: `python -m pytest tests/test_generation.py --device cuda
--dtype bfloat16`. The GPU report (`python -m benchmarks.gpu_report_measure --section correctness`) runs both.
"""

import copy
import importlib.util

import pytest
import torch
from helpers import (
    FAST,
    finish,
    make_dataset,
    pad_pairs,
    read_log,
    start,
    train_arguments,
    train_command,
    word_tokenizer,
)
from transformers import CompileConfig

from vaswani import VaswaniForConditionalGeneration


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HALF = [torch.bfloat16, torch.float16]
IMPLEMENTATIONS = ["eager", "sdpa", "flash_attention_2"]


def half_precision_model(trained_tiny_model, tmp_path, dtype, implementation):
    if implementation == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    trained_tiny_model.save_pretrained(tmp_path)
    model = VaswaniForConditionalGeneration.from_pretrained(
        tmp_path, dtype=dtype, attn_implementation=implementation, device_map="cuda"
    )
    return model.eval()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_precision_logits_on_the_gpu_match_float32_on_the_cpu(
    trained_tiny_model, translation_pairs, tmp_path, dtype, implementation
):
    """Within 3 roundings of the largest logit (as on the CPU, test_numerics.py), and the same greedy translations of
    a padded batch (flash attention takes the source padding by removing it, the others by masking)."""
    input_ids, attention_mask, labels = pad_pairs(translation_pairs)
    decoder_input_ids = trained_tiny_model.prepare_decoder_input_ids_from_labels(labels)
    model = half_precision_model(trained_tiny_model, tmp_path, dtype, implementation)
    with torch.no_grad():
        expected = trained_tiny_model(input_ids, attention_mask, decoder_input_ids=decoder_input_ids).logits
        logits = model(input_ids.cuda(), attention_mask.cuda(), decoder_input_ids=decoder_input_ids.cuda()).logits
    tolerance = 3 * torch.finfo(dtype).eps * expected.abs().max().item()
    torch.testing.assert_close(logits.float().cpu(), expected, atol=tolerance, rtol=0)
    greedy = {"num_beams": 1, "max_new_tokens": 12}
    expected_tokens = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, **greedy)
    tokens = model.generate(input_ids.cuda(), attention_mask=attention_mask.cuda(), **greedy)
    assert torch.equal(tokens.cpu(), expected_tokens)


def test_flash_attention_beam_search_of_sources_of_different_lengths_gives_sdpas_translations(
    trained_tiny_model, translation_pairs, tmp_path
):
    """The paper's beam search under FlashAttention-2, 4 beams, a padded batch of sources of 4 to 9 tokens: each
    hypothesis keeps its own copy of its sentence's encoder output, and the translations are sdpa's."""
    input_ids, attention_mask, _ = (t.cuda() for t in pad_pairs(translation_pairs))
    translations = {}
    for implementation in ("sdpa", "flash_attention_2"):
        model = half_precision_model(trained_tiny_model, tmp_path / implementation, torch.bfloat16, implementation)
        translations[implementation] = model.generate(input_ids, attention_mask=attention_mask, num_beams=4)
    assert torch.equal(translations["flash_attention_2"], translations["sdpa"])


@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_static_cache_compiled_generation_gives_eager_tokens(trained_tiny_model, translation_pairs, dtype, num_beams):
    """generate() compiles the static-cache decoding step by itself on a GPU: the compiled and eager translations of a
    padded batch are the same."""
    input_ids, attention_mask, _ = (t.cuda() for t in pad_pairs(translation_pairs))
    model = trained_tiny_model.to(device="cuda", dtype=dtype)
    options = {"attention_mask": attention_mask, "num_beams": num_beams, "max_new_tokens": 12}
    eager = model.generate(input_ids, **options)
    compiled = model.generate(
        input_ids, cache_implementation="static", compile_config=CompileConfig(fullgraph=True), **options
    )
    assert torch.equal(compiled, eager)


def test_bfloat16_autocast_training_step_on_the_gpu(trained_tiny_model, translation_pairs):
    """`accelerate launch --mixed_precision bf16` on a GPU: a float32 model under bf16 autocast gives the float32 loss
    to 1%, and one optimizer step keeps every weight and gradient finite and float32."""
    input_ids, attention_mask, labels = (t.cuda() for t in pad_pairs(translation_pairs))
    model = trained_tiny_model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    with torch.no_grad():
        float32_loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, float32_loss, rtol=1e-2, atol=1e-3)
    out.loss.backward()
    optimizer.step()
    for name, parameter in model.named_parameters():
        assert parameter.dtype == torch.float32 and parameter.isfinite().all(), name
        assert parameter.grad.isfinite().all(), name


def test_train_compiles_the_model_on_a_gpu_by_default_and_trains_with_eagers_losses(tmp_path):
    """vaswani-train on a GPU with no --torch_compile: the model trains through torch.compile, the log states the
    compile time, and the losses of token-bucket batches of changing shapes are eager's to 1% (dropout off). The
    compiled and the eager run train at once; each assertion names what failed, with the run's output."""
    data = make_dataset(tmp_path / "data", {"train": 600, "validation": 20})
    tokenizer = word_tokenizer(tmp_path / "tokenizer")
    flags = [*FAST, "--config_overrides", "dropout=0.0,attention_dropout=0.0,activation_dropout=0.0"]
    flags += ["--max_steps", 6, "--save_steps", 6, "--average_last", 1, "--logging_steps", 1, "--report_to", "none"]
    flags += ["--eval_steps", 6, "--eval_bleu_samples", 4]
    runs = {"default": [], "eager": ["--torch_compile", False]}
    started = [
        start(train_command(*train_arguments(data, tokenizer, tmp_path / name, *flags, *extra)))
        for name, extra in runs.items()
    ]
    losses = {}
    for (name, process), (stdout, stderr) in zip(zip(runs, started), finish(*started, timeout=600)):
        output = f"its output ends:\n{stdout[-2500:]}\n{stderr[-2500:]}"
        assert process.returncode == 0, f"the {name} run failed; {output}"
        assert "on cuda" in stdout, f"the {name} run did not say it trains on cuda; {output}"
        stated = "torch.compile: the first step, compiling the model, took" in stdout
        assert stated == (name == "default"), (
            f"the {name} run {'states' if stated else 'lacks'} a compile time; {output}"
        )
        losses[name] = [record["loss"] for record in read_log(tmp_path / name) if "loss" in record]
    assert len(losses["default"]) == 6, f"the default run logged {len(losses['default'])} losses, not 6"
    assert losses["default"] == pytest.approx(losses["eager"], rel=1e-2), (
        f"compiled losses {losses['default']} are not eager's {losses['eager']} to 1%"
    )


def test_sdpas_flash_kernel_gives_float32s_logits_and_translations(trained_tiny_model, translation_pairs):
    """FlashAttention as PyTorch ships it: with only SDPA's flash kernel allowed, a batch without padding (the kernel
    takes no mask: the model must pass none, and ask for causality with `is_causal`) gives float32's logits to 3
    roundings of bfloat16 and its greedy translations."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shortest = min(len(source) for source, _ in translation_pairs), min(len(target) for _, target in translation_pairs)
    input_ids = torch.tensor([source[: shortest[0]] for source, _ in translation_pairs])
    decoder_input_ids = torch.tensor([target[: shortest[1]] for _, target in translation_pairs])
    expected = trained_tiny_model(input_ids, decoder_input_ids=decoder_input_ids).logits
    expected_tokens = trained_tiny_model.generate(input_ids, num_beams=1, max_new_tokens=12)
    model = copy.deepcopy(trained_tiny_model).to(device="cuda", dtype=torch.bfloat16)
    model.set_attn_implementation("sdpa")
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        logits = model(input_ids.cuda(), decoder_input_ids=decoder_input_ids.cuda()).logits
        tokens = model.generate(input_ids.cuda(), num_beams=1, max_new_tokens=12)
    tolerance = 3 * torch.finfo(torch.bfloat16).eps * expected.abs().max().item()
    torch.testing.assert_close(logits.float().cpu(), expected.detach(), atol=tolerance, rtol=0)
    assert torch.equal(tokens.cpu(), expected_tokens)
