"""Shared fixtures: tiny models for fast CPU tests."""

import copy
from pathlib import Path

import pytest
import torch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.training.tokenizer import train_bpe_tokenizer


REPO_ROOT = Path(__file__).resolve().parent.parent  # for the files the tests run or read: scripts, configs, docs

VOCAB_SIZE = 100


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
    return VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0, max_position_embeddings=128)


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


def make_translation_pairs() -> list[tuple[list[int], list[int]]]:
    """Eight (source, target) pairs of 3 to 8 tokens + end-of-sentence: the target is the source reversed and mapped
    through a fixed permutation, so that translating needs the positions, the source mask and every source token."""
    generator = torch.Generator().manual_seed(7)
    pairs = []
    for length in (3, 4, 5, 5, 6, 7, 8, 8):
        source = torch.randint(4, VOCAB_SIZE, (length,), generator=generator).tolist()
        target = [(token * 37) % (VOCAB_SIZE - 4) + 4 for token in reversed(source)]
        pairs.append((source + [2], target + [2]))
    return pairs


def pad_pairs(pairs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids right-padded with 0, attention_mask, labels padded with -100)."""
    source_length, target_length = (max(len(pair[side]) for pair in pairs) for side in (0, 1))
    input_ids = torch.tensor([source + [0] * (source_length - len(source)) for source, _ in pairs])
    labels = torch.tensor([target + [-100] * (target_length - len(target)) for _, target in pairs])
    return input_ids, (input_ids != 0).long(), labels


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
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, dropout=0.0, max_position_embeddings=128)
    input_ids, attention_mask, labels = pad_pairs(translation_pairs)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.02:  # targets at about 0.98 probability: greedy decoding gives every pair's
            break
    return model.eval()


@pytest.fixture
def trained_tiny_model(trained_tiny_model_once) -> VaswaniForConditionalGeneration:
    return copy.deepcopy(trained_tiny_model_once)


PAIRS = [
    ("In the beginning God created the heavens and the earth.", "En el principio creó Dios los cielos y la tierra."),
    ("Jesus wept.", "Y lloró Jesús."),
    ("The Lord is my shepherd.", "El Señor es mi pastor."),
    ("Love is patient and kind.", "El amor es sufrido, es benigno."),
]


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
