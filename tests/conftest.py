"""Shared fixtures: tiny models for fast CPU tests."""

from pathlib import Path

import pytest
import torch

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


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
