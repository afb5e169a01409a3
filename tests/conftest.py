"""Shared fixtures: tiny models for fast CPU tests."""

import copy
import os

import pytest
import torch
from helpers import PAIRS, REPO_ROOT, VOCAB_SIZE, make_translation_pairs, run_command, tiny_model_config, trained_on

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.corpora.tokenizer import train_bpe_tokenizer


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device for the tests that take one, e.g. cuda")
    parser.addoption("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


@pytest.fixture
def device(request) -> torch.device:
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def dtype(request) -> torch.dtype:
    return getattr(torch, request.config.getoption("--dtype"))


@pytest.fixture
def tiny_config() -> VaswaniConfig:
    """The tiny preset without dropout, so that training-mode and evaluation-mode outputs can be compared."""
    return tiny_model_config()


@pytest.fixture
def tiny_model(tiny_config) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    return VaswaniForConditionalGeneration(tiny_config).eval()


@pytest.fixture
def source_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Two source sentences, the second right-padded: (input_ids, attention_mask)."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, VOCAB_SIZE, (2, 9), generator=generator)
    input_ids[:, -1] = 2
    input_ids[1, 6:] = torch.tensor([2, 0, 0])
    attention_mask = (input_ids != 0).long()
    return input_ids, attention_mask


@pytest.fixture(scope="session")
def translation_pairs() -> list[tuple[list[int], list[int]]]:
    return make_translation_pairs()


@pytest.fixture(scope="session")
def trained_tiny_model_once(translation_pairs) -> VaswaniForConditionalGeneration:
    """The tiny model trained on `translation_pairs` until it translates them (40 steps, under a second on 2 cores).

    An untrained model emits nearly the same token at every step, so a decoding bug that changes its logits rarely
    changes its tokens; this one is confident, and each position's logits depend on the position and the source.
    Use `trained_tiny_model`, a copy per test; this session-wide original must not be changed.
    """
    return trained_on(translation_pairs, tiny_model_config())


@pytest.fixture
def trained_tiny_model(trained_tiny_model_once) -> VaswaniForConditionalGeneration:
    return copy.deepcopy(trained_tiny_model_once)


@pytest.fixture(scope="session")
def trained_text_model(tmp_path_factory):
    """A tiny model that has learnt four translations by heart, saved with its tokenizer."""
    tokenizer = train_bpe_tokenizer([text for pair in PAIRS for text in pair] * 20, vocab_size=300)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), max_position_embeddings=128, dropout=0.0)
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    batch = tokenizer([s for s, _ in PAIRS], text_target=[t for _, t in PAIRS], padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    folder = tmp_path_factory.mktemp("model")
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer, folder


@pytest.fixture(scope="session")
def fairseq_python():
    """A Python with fairseq: VASWANI_FAIRSEQ_PYTHON, else .fairseq-venv's, built by scripts/install_fairseq.sh the
    first time (it prints the environment's Python; a second run finds it built)."""
    if os.environ.get("VASWANI_FAIRSEQ_PYTHON"):
        return os.environ["VASWANI_FAIRSEQ_PYTHON"]
    done = run_command(["bash", REPO_ROOT / "scripts" / "install_fairseq.sh"], timeout=3600, check=True)
    return done.stdout.strip().splitlines()[-1]
