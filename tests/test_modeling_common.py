"""`transformers`' common model tests (`ModelTesterMixin`, `ConfigTester`) against VaswaniModel and
VaswaniForConditionalGeneration: the suite every model in the library passes, with a tester modelled on Marian's.

The mixins are not part of the installed library: they come from the `tests/` folder of the `transformers` sdist of
the installed version, which this file fetches from PyPI when run as a script and which must then be importable as the
package `tests`:

    PYTHONPATH="$(python3 tests/test_modeling_common.py)" python3 -m pytest tests/test_modeling_common.py

Without them this file is skipped (under CI it fails instead). The sdist ships `tests/*.py` only, while
`test_modeling_common.py` imports three modules of subfolders it leaves out; the fetch writes stand-ins for those
(`STAND_INS`), so `GenerationTesterMixin` and `ExportTesterMixin` add no tests here (generation is tested by
tests/test_generation.py). A checkout of the `transformers` repository at the matching tag, put on PYTHONPATH instead,
runs them as well. `PipelineTesterMixin` is left out: it runs pipelines on tiny checkpoints from the Hub, and
transformers 5 has no translation pipeline (the model brings its own, tested by tests/test_hub.py).
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES
from transformers.testing_utils import torch_device

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani.modeling.modeling_vaswani import VaswaniDecoder, VaswaniEncoder


# The common tests pass the cache under its old name on purpose, to check that it still works and warns.
pytestmark = pytest.mark.filterwarnings("default:`past_key_values` is deprecated:FutureWarning")

FETCH_COMMAND = 'PYTHONPATH="$(python3 tests/test_modeling_common.py)" python3 -m pytest tests/test_modeling_common.py'

# Modules that `tests/test_modeling_common.py` and `tests/test_configuration_common.py` import from subfolders of the
# transformers repository that its sdist does not ship; each stand-in defines only the name imported.
STAND_INS = {
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
    "utils/test_configuration_utils.py": "config_common_kwargs = {}\n",
}
STAND_IN_HEADER = "# Stand-in written by vaswani's tests/test_modeling_common.py: not in the transformers sdist.\n"


def fetch_transformers_tests(cache_dir: Path | None = None) -> Path:
    """Download the sdist of the installed `transformers` once and unpack its `tests/` as an importable package.

    Returns the folder to put on PYTHONPATH (it holds `tests/`): `~/.cache/vaswani/transformers-VERSION` by default.
    """
    version = transformers.__version__
    if cache_dir is None:
        cache_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vaswani"
    root = cache_dir / f"transformers-{version}"
    if (root / "tests" / "test_modeling_common.py").is_file():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as work:
        download = Path(work) / "download"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                str(download),
                f"transformers=={version}",
            ],
            check=True,
            stdout=sys.stderr,  # stdout is the folder printed for PYTHONPATH
        )
        (sdist,) = download.glob("transformers-*.tar.gz")
        staging = Path(work) / "root"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and parts[1:2] == ("tests",) and ".." not in parts:
                    target = staging.joinpath(*parts[1:])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.extractfile(member).read())
        tests = staging / "tests"
        if not (tests / "test_modeling_common.py").is_file():
            raise RuntimeError(f"{sdist.name} has no tests/test_modeling_common.py.")
        for relative, source in STAND_INS.items():
            module = tests / relative
            if not module.exists():
                module.parent.mkdir(parents=True, exist_ok=True)
                module.write_text(STAND_IN_HEADER + source, encoding="utf-8")
        # A regular package, so that `tests` is transformers' even where this repository's tests/ (a namespace
        # package, no __init__.py) is on sys.path too, as it is under `python -m pytest` from the checkout.
        for package in (tests, *(folder for folder in tests.rglob("*") if folder.is_dir())):
            (package / "__init__.py").touch()
        try:
            staging.rename(root)
        except OSError:
            if not (root / "tests" / "test_modeling_common.py").is_file():  # not another process's finished copy
                raise
    return root


# Before the mixins are imported, which is what running this file as a script is for.
if __name__ == "__main__":
    print(fetch_transformers_tests())
    sys.exit()


def transformers_test_module(name: str):
    """`tests.NAME` of transformers' test package, or a skip of this file (a failure under CI) saying how to get it."""
    spec = importlib.util.find_spec("tests")
    # A namespace package (no origin) is only this repository's own tests/ folder.
    if spec is None or spec.origin is None or not (Path(spec.origin).parent / "test_modeling_common.py").is_file():
        reason = f"transformers' common model tests are not importable as the package `tests`; run: {FETCH_COMMAND}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    with warnings.catch_warnings():
        # Its markers (flash_attn_test, torch_compile_test, ...) are registered by transformers' own pytest config.
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        return importlib.import_module(f"tests.{name}")


modeling_common = transformers_test_module("test_modeling_common")
ConfigTester = transformers_test_module("test_configuration_common").ConfigTester
GenerationTesterMixin = transformers_test_module("generation.test_utils").GenerationTesterMixin
ModelTesterMixin = modeling_common.ModelTesterMixin
ids_tensor = modeling_common.ids_tensor


class VaswaniModelTester:
    """Marian's tester for this model: a 2+2-layer model of width 16 and random batches of 13 sequences."""

    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        is_training=True,
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=100,
        eos_token_id=2,
        pad_token_id=1,
        bos_token_id=0,
        decoder_start_token_id=3,
        **config_fields,
    ):
        self.parent = parent
        self.config_fields = config_fields
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.decoder_start_token_id = decoder_start_token_id

    def get_config(self):
        return VaswaniConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            dropout=self.hidden_dropout_prob,
            attention_dropout=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            eos_token_id=self.eos_token_id,
            bos_token_id=self.bos_token_id,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            **self.config_fields,
        )

    def prepare_config_and_inputs(self):
        # Source ids above the special ones, each sentence ending in EOS; any decoder ids.
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        config = self.get_config()
        inputs_dict = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": input_ids.ne(config.pad_token_id),
            "decoder_attention_mask": decoder_input_ids.ne(config.pad_token_id),
        }
        return config, inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(self, config, inputs_dict):
        model = VaswaniModel(config).to(torch_device).eval()
        encoder_hidden_states = model.get_encoder()(inputs_dict["input_ids"], inputs_dict["attention_mask"])[0]
        decoder = model.get_decoder()
        input_ids, attention_mask = inputs_dict["decoder_input_ids"], inputs_dict["decoder_attention_mask"]
        encoder_kwargs = {
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": inputs_dict["attention_mask"],
        }
        cache = decoder(input_ids, attention_mask, use_cache=True, **encoder_kwargs).cache

        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_attention_mask = torch.cat([attention_mask, ids_tensor((self.batch_size, 3), 2)], dim=-1)
        without_past = decoder(torch.cat([input_ids, next_tokens], dim=-1), next_attention_mask, **encoder_kwargs)[0]
        with_past = decoder(next_tokens, next_attention_mask, cache=cache, **encoder_kwargs)[0]

        self.parent.assertEqual(with_past.shape[1], next_tokens.shape[1])
        torch.testing.assert_close(with_past, without_past[:, -3:], atol=1e-3, rtol=1e-3)

    def check_encoder_decoder_model_standalone(self, config, inputs_dict):
        model = VaswaniModel(config).to(torch_device).eval()
        outputs = model(**inputs_dict)

        with tempfile.TemporaryDirectory() as tmpdirname:
            model.get_encoder().save_pretrained(tmpdirname)
            encoder = VaswaniEncoder.from_pretrained(tmpdirname).to(torch_device)
        encoder_last_hidden_state = encoder(inputs_dict["input_ids"], attention_mask=inputs_dict["attention_mask"])[0]
        torch.testing.assert_close(encoder_last_hidden_state, outputs.encoder_last_hidden_state, atol=1e-3, rtol=1e-3)

        with tempfile.TemporaryDirectory() as tmpdirname:
            model.get_decoder().save_pretrained(tmpdirname)
            decoder = VaswaniDecoder.from_pretrained(tmpdirname).to(torch_device)
        last_hidden_state = decoder(
            input_ids=inputs_dict["decoder_input_ids"],
            attention_mask=inputs_dict["decoder_attention_mask"],
            encoder_hidden_states=outputs.encoder_last_hidden_state,
            encoder_attention_mask=inputs_dict["attention_mask"],
        )[0]
        torch.testing.assert_close(last_hidden_state, outputs.last_hidden_state, atol=1e-3, rtol=1e-3)


# As Marian's; `GenerationTesterMixin` adds its tests only where the real one is on the path, not the sdist's stand-in.
class VaswaniModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    is_encoder_decoder = True
    # The test dates a model by the copyright line of its configuration file, which ours does not have, and would
    # skip it as older than 2023.
    test_can_init_all_missing_weights_before_2023 = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The common tests find a model's role (base model, seq2seq head) by class name in the library's tables, which
        # `AutoModel.register` does not extend: without these entries they would give the head no labels and skip
        # their base-model checks.
        for names, class_name in (
            (MODEL_MAPPING_NAMES, "VaswaniModel"),
            (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "VaswaniForConditionalGeneration"),
        ):
            cls.enterClassContext(mock.patch.dict(names, {VaswaniConfig.model_type: class_name}))

    def setUp(self):
        self.model_tester = VaswaniModelTester(self)
        self.config_tester = ConfigTester(self, config_class=VaswaniConfig, d_model=16)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_save_load_strict(self):
        config, _ = self.model_tester.prepare_config_and_inputs()
        for model_class in self.all_model_classes:
            model = model_class(config)
            with tempfile.TemporaryDirectory() as tmpdirname:
                model.save_pretrained(tmpdirname)
                _, info = model_class.from_pretrained(tmpdirname, output_loading_info=True)
            self.assertEqual(info["missing_keys"], set())
            self.assertEqual(info["unexpected_keys"], set())

    def test_decoder_model_past_with_large_inputs(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs()
        self.model_tester.create_and_check_decoder_model_past_large_inputs(*config_and_inputs)

    def test_encoder_decoder_model_standalone(self):
        config_and_inputs = self.model_tester.prepare_config_and_inputs_for_common()
        self.model_tester.check_encoder_decoder_model_standalone(*config_and_inputs)


class VaswaniRowsBAndEModelTest(VaswaniModelTest):
    """The same tests on Table 3's rows (B) and (E) at once: heads whose queries and keys (d_k = 8) are larger than
    their values (d_v = 2), and learned positional embeddings in place of the sinusoids."""

    def setUp(self):
        self.model_tester = VaswaniModelTester(self, d_k=8, d_v=2, positional_encoding="learned")
        self.config_tester = ConfigTester(self, config_class=VaswaniConfig, d_model=16, d_k=8, d_v=2)
