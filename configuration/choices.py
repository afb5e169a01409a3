"""The names of the presets and of the weight-initialisation schemes, for command-line choices.

configuration_vaswani.py defines `PRESETS` and `INIT_SCHEMES` (it is also the code a saved model folder carries, so
they stay there), and importing it imports transformers and torch. Their keys are read here from its source instead,
as the literals they are, so that a command lists them in --help at once; `VaswaniConfig` checks the values again.
"""

import ast
from pathlib import Path


def _literal_names(*names):
    """The keys of the dict literals assigned to `names` at the top level of configuration_vaswani.py, in order."""
    tree = ast.parse((Path(__file__).with_name("configuration_vaswani.py")).read_text(encoding="utf-8"))
    found = {
        node.targets[0].id: tuple(ast.literal_eval(node.value))
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in names
    }
    return tuple(found[name] for name in names)


PRESET_NAMES, INIT_SCHEME_NAMES = _literal_names("PRESETS", "INIT_SCHEMES")
