"""The model's configuration (configuration_vaswani), imported on first use; `choices` names the presets and the
initialisation schemes without importing it (and transformers, and torch)."""

import importlib


_LAZY = dict.fromkeys(("PRESETS", "VaswaniConfig", "remote_code_files"), ".configuration_vaswani")


def __getattr__(name):
    if name in ("configuration_vaswani", "choices"):
        return importlib.import_module(f".{name}", __name__)
    if name not in _LAZY:
        raise AttributeError(f"module 'vaswani.configuration' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
