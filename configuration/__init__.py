from .configuration_vaswani import PRESETS, VaswaniConfig, write_remote_code

__all__ = ["PRESETS", "VaswaniConfig", "write_remote_code"]
