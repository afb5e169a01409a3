"""Translating a text file of any size (`files`): in chunks, shared by the processes `accelerate launch` starts,
resumable, its output whole or absent. `vaswani-translate` runs it, and `vaswani-evaluate` shares a test set the same
way."""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {"files": ["FileTranslation", "LineFile", "launch"]}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
