"""The metric's widget when this folder is a Hugging Face Space (the card's `app_file`); `evaluate.load` reads
vaswani_bleu.py, not this file. The Space needs the `vaswani` package installed (a requirements.txt naming it)."""

from pathlib import Path

import evaluate
from evaluate.utils import launch_gradio_widget


launch_gradio_widget(evaluate.load(str(Path(__file__).resolve().parent)))
