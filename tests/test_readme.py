"""The README's examples run as they stand."""

import re

from helpers import REPO_ROOT, make_dataset, word_tokenizer
from transformers import AutoModelForSeq2SeqLM

from vaswani.training.checkpoints import load_checkpoint_weights


README = REPO_ROOT / "README.md"


def readme_block(heading):
    """The first ```python block after `heading`."""
    text = README.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.DOTALL)[1]


def test_your_own_training_loop_runs_and_averages_its_checkpoints(tmp_path, monkeypatch):
    """The library is enough to write a loop: data, batches, schedule, loss, checkpoints and their average."""
    make_dataset(tmp_path / "outputs" / "main_job" / "data", {"train": 400, "validation": 20})
    word_tokenizer(tmp_path / "outputs" / "main_job" / "tokenizer")
    monkeypatch.chdir(tmp_path)
    exec(readme_block("### Your own training loop"), {"__name__": "readme"})
    steps = [load_checkpoint_weights(tmp_path / "my-run" / f"step_{step}") for step in (40, 80, 120)]
    final = load_checkpoint_weights(tmp_path / "my-run" / "final")
    key = "model.shared.weight"
    assert ((steps[0][key] + steps[1][key] + steps[2][key]) / 3 - final[key]).abs().max() < 1e-6
    assert (steps[0][key] - steps[2][key]).abs().max() > 1e-3  # it trained
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "my-run" / "final").config.d_model == 64
