"""How a long job shows its progress: a live bar where a person watches a terminal, and few lines where its output
goes to a log (a file or a pipe: `vaswani-train ... > log 2>&1`, nohup, a cluster's job log), so that a run of
100,000 steps leaves a log a person reads rather than megabytes of bar updates.

- `progress_bar(...)` is tqdm's bar (`tqdm.auto`, so a notebook gets its widget), updated at most every
  `LOG_INTERVAL` seconds where standard error is not a terminal; the figures a person looks for are written as lines
  of their own (the training loop's at each logging step).
- `quiet_library_bars()`, which every command calls first (`vaswani.cli.command`), turns off where standard error is
  not a terminal the bars of the libraries the commands call (transformers' loading of weights, datasets' maps and
  saves, the Hub's transfers), which update ten times a second: the commands say in lines of their own what those steps did.
"""

import os
import sys

from tqdm.auto import tqdm


# At most one bar update every this many seconds in a log: a few lines a minute, whatever the steps' speed.
LOG_INTERVAL = 30.0


def watched() -> bool:
    """Whether a person watches the output live: standard error is a terminal, or tqdm draws a notebook's widget."""
    # tqdm.auto's class derives from tqdm.notebook's in a notebook (whose stderr is no terminal), else from the text bar.
    return sys.stderr.isatty() or any(base.__module__ == "tqdm.notebook" for base in tqdm.__mro__)


def progress_bar(iterable=None, **options) -> tqdm:
    """`tqdm.auto.tqdm(iterable, **options)`, updated at most every LOG_INTERVAL seconds where nobody watches it live
    (tqdm's `mininterval`; `maxinterval` too, whose monitor would otherwise redraw it every 10 s)."""
    if not watched():
        options = {"mininterval": LOG_INTERVAL, "maxinterval": LOG_INTERVAL, **options}
    return tqdm(iterable, **options)


def quiet_library_bars():
    """Where standard error is not a terminal, turn off the progress bars of transformers (loading and saving weights),
    huggingface_hub (transfers) and datasets (maps, saves), through their public switches, for the rest of the
    process."""
    if watched():
        return
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    disable_progress_bars()
    logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    else:  # datasets reads it when imported: a command that never needs datasets does not pay its second of import
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
