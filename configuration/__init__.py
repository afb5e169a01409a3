"""The model's configuration (configuration_vaswani): the presets of Table 3 and the initialisation schemes."""

from .configuration_vaswani import PRESETS, VaswaniConfig, remote_code_files


__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
