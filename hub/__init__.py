"""The Hugging Face Hub: a trained model's folder pushed in one commit with its model card (`push`), the card
written from the run's own records (`model_card`). `vaswani-push-to-hub` and `vaswani-train --push_to_hub` run them;
the `hub` extra brings the card's templates.
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {
    "push": ["push_after_training", "push_to_hub"],
    "model_card": ["render_model_card"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
