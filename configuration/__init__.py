from .configuration_vaswani import PRESETS, VaswaniConfig, remote_code_files


__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
