#!/usr/bin/env bash
# A virtual environment with fairseq, apart from the main install, for checking scripts/convert_fairseq.py against
# fairseq itself (tests/test_convert_fairseq.py, whose first run builds it here at .fairseq-venv, unless
# VASWANI_FAIRSEQ_PYTHON names another). Prints the environment's Python; a second run finds fairseq there and stops.
#
# fairseq is unmaintained: `fairseq-fixed` is its 0.12 code, installable on Python 3.11. It declares torchaudio,
# which the translation models never import and whose builds pin other torch versions (a multi-GB CUDA download), so
# its other dependencies are installed by name and fairseq itself without them; its C++ and Cython extensions build
# against the environment's CPU torch (minutes, once: pip caches the wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.fairseq-venv
pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; }
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import fairseq" 2> /dev/null; then
    echo "$PWD/$venv/bin/python"
    exit 0
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip_install "torch==2.13.0" "numpy<3" cython setuptools wheel
pip_install cffi "hydra-core==1.3.2" "omegaconf==2.3.0" regex sacrebleu tqdm bitarray scikit-learn packaging \
    "sacremoses==0.2.0" "subword-nmt==0.3.8"
pip_install --no-deps --no-build-isolation "fairseq-fixed==0.12.3.1"
echo "$PWD/$venv/bin/python"
