"""The model's configuration (configuration_vaswani); `choices` names the presets and the initialisation schemes."""

from .configuration_vaswani import PRESETS, VaswaniConfig, remote_code_files


__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
