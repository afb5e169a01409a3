"""A package's names imported on first use (a module `__getattr__`, PEP 562), so that importing the package costs
nothing until one of its names is used."""

import importlib
import sys


def lazy_names(package, exports):
    """`__getattr__`, `__dir__` and `__all__` for the package named `package`: each name of `exports` (the package's
    module -> the names it defines) is imported on first use and kept."""
    homes = {name: f".{module}" for module, names in exports.items() for name in names}

    def __getattr__(name):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__, sorted(homes)
