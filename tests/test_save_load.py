"""Saving and loading: safetensors, the Auto classes, and remote code on a machine without this package."""

import hashlib
import json
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
from helpers import REPO_ROOT, tiny_model_config
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.testing_utils import CaptureLogger, LoggingLevel
from transformers.utils import logging

import vaswani
from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani.configuration.configuration_vaswani import remote_code_files


def test_round_trip_gives_identical_logits(tiny_model, source_batch, tmp_path):
    input_ids, attention_mask = source_batch
    tiny_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.bin"))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, VaswaniForConditionalGeneration)
    with torch.no_grad():
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": input_ids[:, :5]}
        assert torch.equal(tiny_model(**inputs).logits, loaded(**inputs).logits)


def test_auto_classes_resolve(tiny_config, tmp_path):
    assert isinstance(AutoModel.from_config(tiny_config), VaswaniModel)
    assert isinstance(AutoModelForSeq2SeqLM.from_config(tiny_config), VaswaniForConditionalGeneration)
    VaswaniForConditionalGeneration(tiny_config).save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), VaswaniConfig)
    bare = AutoModel.from_pretrained(tmp_path)  # the bare encoder-decoder out of a full checkpoint
    assert isinstance(bare, VaswaniModel)


def test_saved_folder_carries_the_code_and_auto_map(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vaswani.VaswaniConfig",
        "AutoModel": "modeling_vaswani.VaswaniModel",
        "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
    }
    modeling = (tmp_path / "modeling_vaswani.py").read_text()
    assert "from .configuration_vaswani import VaswaniConfig" in modeling
    assert "from ..configuration" not in modeling
    package_configuration = REPO_ROOT / "configuration" / "configuration_vaswani.py"
    assert (tmp_path / "configuration_vaswani.py").read_text() == package_configuration.read_text()
    # The config names the code: the package version and the hash of exactly the files written beside it.
    code_files = sorted(remote_code_files())
    written = "".join((tmp_path / name).read_text() for name in code_files)
    assert config["code_sha256"] == hashlib.sha256(written.encode()).hexdigest()
    assert config["vaswani_version"] == vaswani.__version__


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["vaswani"] = None  # this process must not find the package
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    folder, inputs_file = sys.argv[1], sys.argv[2]
    inputs = torch.load(inputs_file)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    assert type(AutoConfig.from_pretrained(folder, trust_remote_code=True)).__name__ == "VaswaniConfig"
    assert type(AutoModel.from_pretrained(folder, trust_remote_code=True)).__name__ == "VaswaniModel"
    with torch.no_grad():
        logits = model(**inputs).logits
    generated = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=8)
    # The paper's decoding (generation_vaswani.py, loaded with the model): GNMT scores, each sentence's own limit.
    paper = model.generate(
        inputs["input_ids"], attention_mask=inputs["attention_mask"], output_scores=True, return_dict_in_generate=True
    )
    torch.save(
        {"logits": logits, "generated": generated, "paper": paper.sequences, "scores": paper.sequences_scores},
        inputs_file + ".out",
    )
    """
)


@pytest.mark.parametrize(
    "table3_rows",
    [
        pytest.param({}, id="base"),
        pytest.param(
            {"d_k": 8, "d_v": 32, "positional_encoding": "learned", "max_position_embeddings": 64},
            id="rows (B) and (E)",
            marks=pytest.mark.slow,  # a second fresh process; the base run covers the default suite
        ),
    ],
)
def test_fresh_process_without_the_package_loads_with_remote_code(source_batch, tmp_path, table3_rows):
    """The folder's own code, in a process without the package, computes and decodes as the model; also with Table 3's
    rows (B) and (E): keys and values of other sizes than d_model / h, learned positions."""
    torch.manual_seed(0)
    tiny_model = VaswaniForConditionalGeneration(tiny_model_config(**table3_rows)).eval()
    input_ids, attention_mask = source_batch
    folder = tmp_path / "model"
    tiny_model.save_pretrained(folder)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": input_ids[:, :5]}
    torch.save(inputs, tmp_path / "inputs.pt")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, "-c", REMOTE_LOAD, str(folder), str(tmp_path / "inputs.pt")],
        cwd=tmp_path,
        env=env,
        check=True,
    )
    remote = torch.load(tmp_path / "inputs.pt.out")
    with torch.no_grad():
        # Not bit-equal: the two processes may split matrix products over different numbers of threads.
        torch.testing.assert_close(remote["logits"], tiny_model(**inputs).logits, atol=1e-6, rtol=1e-6)
    assert torch.equal(
        remote["generated"], tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8)
    )
    paper = tiny_model.generate(
        input_ids, attention_mask=attention_mask, output_scores=True, return_dict_in_generate=True
    )
    assert torch.equal(remote["paper"], paper.sequences)
    torch.testing.assert_close(remote["scores"], paper.sequences_scores, atol=1e-5, rtol=1e-5)


def test_refreshing_a_folder_saved_by_an_earlier_version_gives_it_this_versions_code(tiny_model, tmp_path):
    """docs/sharing.md, "Loading anywhere": a folder keeps the code it was saved with; loading it with the package installed
    and saving it again replaces that code (and what the config says of it), and leaves the weights as they were."""
    old, new = tmp_path / "old", tmp_path / "new"
    tiny_model.save_pretrained(old)
    code_files = sorted(remote_code_files())
    for name in code_files:  # as an earlier version left them: other code, another version and hash
        (old / name).write_text("# saved by vaswani 0.1.0\n" + (old / name).read_text())
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "vaswani_version": "0.1.0", "code_sha256": "0" * 64}))

    VaswaniForConditionalGeneration.from_pretrained(old).save_pretrained(new)

    current = remote_code_files()
    assert {name: (new / name).read_text() for name in code_files} == current
    refreshed = json.loads((new / "config.json").read_text())
    assert refreshed["vaswani_version"] == vaswani.__version__
    assert (
        refreshed["code_sha256"] == hashlib.sha256("".join(current[n] for n in sorted(current)).encode()).hexdigest()
    )
    assert load_file(new / "model.safetensors").keys() == load_file(old / "model.safetensors").keys()
    for name, tensor in load_file(old / "model.safetensors").items():
        assert torch.equal(load_file(new / "model.safetensors")[name], tensor), name


def test_remote_loaded_model_saves_a_folder_that_loads_again(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "first")
    remote = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "first", trust_remote_code=True)
    remote.save_pretrained(tmp_path / "second")
    for name in remote_code_files():
        assert (tmp_path / "second" / name).read_text() == (tmp_path / "first" / name).read_text()


@pytest.mark.slow  # builds the wheel and installs it into a fresh environment
def test_wheel_installs_the_vaswani_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=REPO_ROOT,
        check=True,
    )
    (wheel,) = tmp_path.glob("vaswani-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "vaswani/__init__.py",
        "vaswani/configuration/__init__.py",
        "vaswani/configuration/configuration_vaswani.py",
        "vaswani/modeling/__init__.py",
        "vaswani/modeling/modeling_vaswani.py",
        "vaswani/training/__init__.py",
        "vaswani/training/schedule.py",
        "vaswani/checks.py",
        "vaswani/cli.py",
        "vaswani/corpora/tokenizer.py",
        "vaswani/evaluation/bleu.py",
        "vaswani/finetuning/trainer.py",
        "vaswani/hub/push.py",
        "vaswani/export/ctranslate2.py",
        "vaswani/scripts/train.py",
        "vaswani/model_card.md",  # the Hub card's template, read by vaswani.hub.push
    } <= names
    assert not any(
        name.startswith(("vaswani/tests", "vaswani/docs", "vaswani/configs", "tests/", "scripts/")) for name in names
    )
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    console = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "vaswani-train = vaswani.scripts.train:main" in console
    assert "vaswani-evaluate = vaswani.scripts.evaluate_bleu:main" in console
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True
    )
    check = "import vaswani, sys; assert vaswani.__file__.startswith(sys.argv[1]), vaswani.__file__; print(vaswani.__version__)"
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path[:0] = [sys.argv[1], *{sys.path[1:]!r}]; {check}",
            str(target),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == vaswani.__version__


def test_missing_tensors_are_initialised_and_reported(tiny_model, tmp_path):
    """The library's convention: a checkpoint that lacks some of the model's tensors (here, of a model one encoder
    layer deeper) loads; the missing tensors are initialised by `_init_weights` and reported, the rest are loaded."""
    tiny_model.save_pretrained(tmp_path)
    with LoggingLevel(logging.WARNING), CaptureLogger(logging.get_logger("transformers.modeling_utils")) as report:
        deeper = VaswaniForConditionalGeneration.from_pretrained(tmp_path, encoder_layers=3)
    _, info = VaswaniForConditionalGeneration.from_pretrained(tmp_path, encoder_layers=3, output_loading_info=True)
    new_layer = {f"model.encoder.layers.2.{name}" for name in tiny_model.model.encoder.layers[1].state_dict()}
    assert info["missing_keys"] == new_layer
    assert info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert str(tmp_path) in report.out and "model.encoder.layers.2.self_attn.q_proj.weight" in report.out
    saved, loaded = tiny_model.state_dict(), deeper.state_dict()
    for name in saved:
        assert torch.equal(loaded[name], saved[name]), name
    # `_init_weights` with the config's init_scheme ("fairseq": Glorot-uniform, query at gain 1/sqrt(2)), zero
    # biases, unit LayerNorms (meta or empty tensors would fail).
    layer = deeper.model.encoder.layers[2]
    assert deeper.config.init_scheme == "fairseq"
    bound = 2**-0.5 * (6 / (64 + 64)) ** 0.5
    q_proj = layer.self_attn.q_proj.weight
    assert q_proj.abs().max() <= bound and q_proj.std() > bound / 4
    assert torch.equal(layer.feed_forward.fc1.bias, torch.zeros(256))
    assert torch.equal(layer.final_layer_norm.weight, torch.ones(64))


def test_checkpoint_sharing_part_of_the_model_loads_and_reports_the_rest(tmp_path):
    """A Marian checkpoint names most tensors as this model does: those load, the feed-forward networks (which
    Marian keeps directly in the layer) are initialised and reported, as the library does for any checkpoint."""
    from transformers import MarianConfig, MarianMTModel

    marian = MarianConfig(
        vocab_size=100,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        pad_token_id=0,
        decoder_start_token_id=0,
    )
    marian_model = MarianMTModel(marian)
    marian_model.save_pretrained(tmp_path)
    model = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    _, info = VaswaniForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == {
        f"model.{stack}.layers.0.feed_forward.{linear}.{kind}"
        for stack in ("encoder", "decoder")
        for linear in ("fc1", "fc2")
        for kind in ("weight", "bias")
    }
    assert "model.encoder.layers.0.fc1.weight" in info["unexpected_keys"]
    shared = "model.encoder.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[shared], marian_model.state_dict()[shared])


def test_checkpoint_of_another_architecture_with_nothing_in_common_is_reported_as_transformers_does(tmp_path):
    """As for any model of the library (MarianMTModel, say): every tensor of the model is reported missing and
    initialised, every tensor of the checkpoint unexpected, and the model is the one `_init_weights` draws."""
    from transformers import BertConfig, BertModel

    bert = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    BertModel(bert).save_pretrained(tmp_path)
    for model_class in (VaswaniForConditionalGeneration, VaswaniModel):
        model, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert info["missing_keys"] == set(model.state_dict())
        assert info["unexpected_keys"] == set(BertModel(bert).state_dict())
        layer_norm = model.get_encoder().layers[0].final_layer_norm
        assert torch.equal(layer_norm.weight, torch.ones_like(layer_norm.weight))


def test_checkpoint_with_tensors_of_another_shape_is_refused(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        VaswaniForConditionalGeneration.from_pretrained(tmp_path, vocab_size=120)
