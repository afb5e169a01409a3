#!/usr/bin/env bash
# Install vaswani (editable) with the extras named by the first argument: by default `dev` (tests and lint); the main
# job asks for `train,data` only. torch comes first and pinned: an unpinned torch from PyPI is the multi-GB CUDA build,
# and pip keeps an installed torch that satisfies the package's range. What only the slow tests need is built by them
# when they first run (docs/testing.md): fairseq's environment, DeepSpeed's CPU ops.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-dev}
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
