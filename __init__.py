"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing this package registers `model_type="vaswani"` with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`,
its translation pipeline for the task "translation", and the tokenizer of converted fairseq models with `AutoTokenizer`.

`import vaswani` itself imports neither torch nor transformers, so that it costs nothing until the model is used (the
commands answer --help at once): the classes below are imported on first use, and each registration is made the
moment transformers imports the part of itself that it extends (`transformers.models.auto.configuration_auto`,
`.modeling_auto`, `.tokenization_auto`, `transformers.pipelines`), or at once if that part is already imported. The
model type is registered as transformers registers its own models, by name (its `*_MAPPING_NAMES` tables), so that
no class has to be imported for it; the tokenizer and the pipeline are registered as classes.
"""

import importlib
import importlib.abc
import importlib.metadata
import sys
import warnings

from .lazy_imports import lazy_names


__version__ = importlib.metadata.version("vaswani")

# name -> the module (relative to this package) that defines it, imported on first use.
_LAZY = {
    "PRESETS": ".configuration",
    "VaswaniConfig": ".configuration",
    "VaswaniDecoder": ".modeling",
    "VaswaniEncoder": ".modeling",
    "VaswaniForConditionalGeneration": ".modeling",
    "VaswaniModel": ".modeling",
    "VaswaniPreTrainedModel": ".modeling",
    "VaswaniTranslationPipeline": ".modeling",
    "label_smoothed_cross_entropy": ".modeling",
    "FairseqMosesTokenizer": ".modeling.tokenization_fairseq",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, submodules=("configuration", "modeling", "training", "scripts"))


# --- Registration with transformers, as each of its parts is imported. ---

_PIPELINE_MODULE = "vaswani.modeling.pipeline_vaswani"
_TOKENIZER_MODULE = "vaswani.modeling.tokenization_fairseq"


def _register_config(configuration_auto):
    # AutoConfig finds a model type's config class by name, in the module its mapping keeps for the type.
    configuration_auto.CONFIG_MAPPING_NAMES["vaswani"] = "VaswaniConfig"
    configuration_auto.CONFIG_MAPPING._modules["vaswani"] = sys.modules[__name__]


def _register_models(modeling_auto):
    for mapping, class_name in (
        (modeling_auto.MODEL_MAPPING, "VaswaniModel"),
        (modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING, "VaswaniForConditionalGeneration"),
    ):
        mapping._model_mapping["vaswani"] = class_name  # the library's *_MAPPING_NAMES table
        mapping._reverse_config_mapping["VaswaniConfig"] = "vaswani"  # for mappings built before the config's entry
        mapping._modules["vaswani"] = sys.modules[__name__]


def _register_tokenizer(tokenization_auto, tokenization_fairseq):
    # Found by the name its tokenizer_config.json gives. Registered by name only: AutoTokenizer.register would also
    # make it the default tokenizer of every vaswani folder that names none.
    tokenizer = tokenization_fairseq.FairseqMosesTokenizer
    tokenization_auto.REGISTERED_TOKENIZER_CLASSES[tokenizer.__name__] = tokenizer


def _register_pipeline(pipelines, pipeline_vaswani):
    # transformers 5 removed its "translation" task and refuses the name before it looks at registered tasks; this
    # package brings a translation pipeline, so `pipeline("translation", model=...)` is given back to it.
    pipelines.REMOVED_TASKS.pop("translation", None)
    pipelines.PIPELINE_REGISTRY.register_pipeline(
        "translation",
        pipeline_class=pipeline_vaswani.VaswaniTranslationPipeline,
        pt_model=importlib.import_module("transformers.models.auto.modeling_auto").AutoModelForSeq2SeqLM,
        type="text",
    )


# Each registration: the modules it needs (transformers' part first, then this package's own, if any), what shows
# that a module has finished importing, and the function that registers.
_REGISTRATIONS = [
    ((("transformers.models.auto.configuration_auto", "CONFIG_MAPPING"),), _register_config),
    ((("transformers.models.auto.modeling_auto", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING"),), _register_models),
    (
        (
            ("transformers.models.auto.tokenization_auto", "REGISTERED_TOKENIZER_CLASSES"),
            (_TOKENIZER_MODULE, "FairseqMosesTokenizer"),
        ),
        _register_tokenizer,
    ),
    (
        (("transformers.pipelines", "PIPELINE_REGISTRY"), (_PIPELINE_MODULE, "VaswaniTranslationPipeline")),
        _register_pipeline,
    ),
]
_TRIGGERS = {name for needs, _ in _REGISTRATIONS for name, _ in needs}


def _register_what_is_ready():
    """Make every registration whose transformers module has finished importing. This package's own module is
    imported for it, unless it is being imported right now (further up the stack): it registers when it is done."""
    for entry in list(_REGISTRATIONS):
        (theirs, marker), *ours = entry[0]
        if entry not in _REGISTRATIONS or not hasattr(sys.modules.get(theirs), marker):
            continue  # made meanwhile (by the import of this package's module below), or transformers' not ready
        if ours and ours[0][0] in sys.modules and not hasattr(sys.modules[ours[0][0]], ours[0][1]):
            continue
        try:
            _REGISTRATIONS.remove(entry)
        except ValueError:  # made meanwhile, by another thread
            continue
        try:
            entry[1](sys.modules[theirs], *(importlib.import_module(name) for name, _ in ours))
        except Exception as error:  # a transformers whose internals moved: say so, never break its import
            warnings.warn(f"vaswani could not register itself with transformers ({type(error).__name__}: {error})")
    if not _REGISTRATIONS and _AfterImport.instance in sys.meta_path:
        sys.meta_path.remove(_AfterImport.instance)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the modules in `_TRIGGERS` it takes the spec the other finders give and wraps its
    loader, so that the registrations waiting for that module are made as soon as it has been executed."""

    instance = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _TRIGGERS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisterAfter(spec.loader)
        return spec


class _RegisterAfter(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader  # the real one, for inspect, linecache, reloads
        self.loader.exec_module(module)
        _register_what_is_ready()

    def __getattr__(self, name):  # get_source, is_package, ...: the real loader's
        return getattr(self.loader, name)


_AfterImport.instance = _AfterImport()
sys.meta_path.insert(0, _AfterImport.instance)
_register_what_is_ready()

__all__ = [
    "PRESETS",
    "FairseqMosesTokenizer",
    "VaswaniConfig",
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
