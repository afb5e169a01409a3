#!/usr/bin/env bash
# Install vaswani (editable) with the extras named by the first argument: by default `dev` (tests and lint), which
# also builds fairseq apart, in .fairseq-venv, for the tests that check the fairseq import against it; the main job
# asks for `train,data` only. torch comes first and pinned: an unpinned torch from PyPI is the multi-GB CUDA build, and
# pip keeps an installed torch that satisfies the package's range.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-dev}
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
if [ "$extras" = dev ]; then
    bash scripts/install_fairseq.sh > /dev/null
fi
if python3 -c "import deepspeed" 2> /dev/null; then
    # DeepSpeed compiles its shared-memory op and its Adam (configs/deepspeed_zero2.json) with g++ when a run first
    # needs them (minutes), into ~/.cache/torch_extensions: once here instead, for the CPU, where the tests run them.
    DS_ACCELERATOR=cpu python3 -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()
from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load()" > /dev/null 2>&1 ||
        { echo "install.sh: DeepSpeed could not build its CPU ops (it needs g++ and ninja)" >&2; exit 1; }
fi
