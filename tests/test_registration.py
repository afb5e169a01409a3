"""`import vaswani` registers the model type with transformers' Auto classes, its translation pipeline with the
pipeline registry and the converted fairseq models' tokenizer with AutoTokenizer, whatever the order of the imports:
before transformers, after `import transformers`, or after the Auto classes and pipelines are loaded. Each order in a
fresh process, as a user's script meets it."""

import json
import sys

import pytest
from helpers import finish, start


CHECK = """
import json
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, pipelines
from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
config = AutoConfig.for_model("vaswani", vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                              decoder_ffn_dim=32)
translation = pipelines.PIPELINE_REGISTRY.check_task("translation")[1]["impl"]
print(json.dumps([type(config).__name__, type(AutoModel.from_config(config)).__name__,
                  type(AutoModelForSeq2SeqLM.from_config(config)).__name__, translation.__name__,
                  tokenizer_class_from_name("FairseqMosesTokenizer").__name__]))
"""
REGISTERED = ["VaswaniConfig", "VaswaniModel", "VaswaniForConditionalGeneration", "VaswaniTranslationPipeline",
              "FairseqMosesTokenizer"]  # fmt: skip
ORDERS = {
    "vaswani first": "import vaswani\n",
    "after import transformers": "import transformers\nimport vaswani\n",
    "after the Auto classes and pipelines": "from transformers import AutoModelForSeq2SeqLM, pipeline\n"
    "import vaswani\n",
}


ADDED_FINDERS = """
import sys
before = list(sys.meta_path)
import vaswani
print([type(finder).__module__ for finder in sys.meta_path if finder not in before])
"""


@pytest.fixture(scope="module")
def printed():
    """The last line each check prints, each in a fresh process (all started at once: seconds of imports each), where a
    warning the code does not catch fails it: by import order, and "finders"."""
    codes = {name: imports + CHECK for name, imports in ORDERS.items()} | {"finders": ADDED_FINDERS}
    processes = [start([sys.executable, "-W", "error::UserWarning", "-c", code]) for code in codes.values()]
    outputs = finish(*processes, timeout=300)
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, f"{process.args[-1]}\n{stdout}\n{stderr}"
    return {name: stdout.splitlines()[-1] for name, (stdout, _) in zip(codes, outputs)}


@pytest.mark.parametrize("order", ORDERS)
def test_the_auto_classes_pipeline_and_tokenizer_know_vaswani_whatever_the_import_order(printed, order):
    assert printed[order] == str(REGISTERED).replace("'", '"')


def test_registering_leaves_the_import_system_alone(printed):
    """The registration is made by transformers' public calls at import: of the finders `import vaswani` puts on
    sys.meta_path, none is the package's (transformers adds its own, and what it imports may add theirs: accelerate
    imports boto3 where it is installed, which adds six's)."""
    added = json.loads(printed["finders"].replace("'", '"'))
    assert "transformers.utils.import_utils" in added and not [module for module in added if "vaswani" in module]
