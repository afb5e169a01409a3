"""Exports to other runtimes: CTranslate2 (`ctranslate2`), through its Transformer spec, checked against the model's
own scores (`vaswani-export-ctranslate2` runs it; the `export` extra brings CTranslate2); ONNX (`onnx`: the encoder
and the decoder's steps with their caches, run on ONNX Runtime without torch by `onnx_runtime`). `torch.export` goes
through torch's own exporter (docs/exports.md).
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {
    "ctranslate2": ["export"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
