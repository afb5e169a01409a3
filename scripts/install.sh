#!/usr/bin/env bash
# Install vaswani (editable) with its test and lint extras (the `dev` extra), and fairseq apart for its tests. torch
# comes first and pinned: an unpinned torch from PyPI is the multi-GB CUDA build, and pip keeps an installed torch that
# satisfies the package's range.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
# fairseq, in a virtual environment of its own (.fairseq-venv), for the tests that check the fairseq import against it.
bash scripts/install_fairseq.sh > /dev/null
