"""The model's configuration (configuration_vaswani), imported on first use; `choices` names the presets and the
initialisation schemes without importing it (and transformers, and torch)."""

from ..lazy_imports import lazy_names


_LAZY = dict.fromkeys(("PRESETS", "VaswaniConfig", "remote_code_files"), ".configuration_vaswani")
__getattr__, __dir__ = lazy_names(__name__, _LAZY, submodules=("configuration_vaswani", "choices"))

__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
