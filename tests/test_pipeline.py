"""`pipeline("translation", ...)`: the package's own pipeline once `vaswani` is imported, the folder's remote code
without the package, the same answers either way."""

import json
import subprocess
import sys

import torch
from helpers import word_tokenizer
from transformers import AutoConfig, AutoTokenizer, pipeline

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline


TEXTS = ["the red cat", "a dog sees the big house"]
OPTIONS = {"num_beams": 2, "max_new_tokens": 6}


def saved_model(folder):
    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer(folder))
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    model.save_pretrained(folder)
    return model, tokenizer


def test_the_translation_task_needs_no_remote_code_once_vaswani_is_imported(tmp_path):
    model, tokenizer = saved_model(tmp_path / "model")
    # The folder keeps its own pipeline for machines without the package...
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.VaswaniTranslationPipeline"
    # ...while the installed package serves the task itself, for a folder and for a model in memory.
    assert "custom_pipelines" not in AutoConfig.from_pretrained(tmp_path / "model").to_dict()
    for source in (str(tmp_path / "model"), model):
        translate = pipeline("translation", model=source, tokenizer=tokenizer if source is model else None)
        assert type(translate) is VaswaniTranslationPipeline
        assert translate(TEXTS, **OPTIONS) == VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(
            TEXTS, **OPTIONS
        )
    model.save_pretrained(tmp_path / "again")  # saving leaves the model in memory as it was
    assert type(pipeline("translation", model=model, tokenizer=tokenizer)) is VaswaniTranslationPipeline


REMOTE_PIPELINE = """
import json, sys
from transformers import pipeline
translate = pipeline("translation", model=sys.argv[1], trust_remote_code=True)
print(json.dumps([type(translate).__module__, translate(json.loads(sys.argv[2]), **json.loads(sys.argv[3]))]))
"""


def test_without_the_package_the_folder_brings_its_pipeline_as_remote_code(tmp_path):
    """A Python without vaswani (the remote-code test's isolation: -S and no site-packages of this package)."""
    model, tokenizer = saved_model(tmp_path / "model")
    hidden = tmp_path / "no_vaswani.pth"
    code = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vaswani' or name.startswith('vaswani.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n" + REMOTE_PIPELINE
    )
    hidden.write_text(code)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(hidden), str(tmp_path / "model"), json.dumps(TEXTS), json.dumps(OPTIONS)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    module, answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert module.startswith("transformers_modules.")  # the folder's copy of pipeline_vaswani.py
    assert answers == VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(TEXTS, **OPTIONS)
