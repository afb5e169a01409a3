#!/usr/bin/env bash
# GPU report, step 2 of 2: one part of the report in one command, on a GPU machine without network access.
#
#   bash CARRY/run.sh OUTPUT_DIR [--part 2] [--device cpu --quick] [--section NAME ...]
#
# Run from the root of the checkout, with CARRY the folder `python -m benchmarks.gpu_report_prepare` wrote (this file is
# its run.sh). It installs the carried wheels and the checkout into a folder of its own that comes first on PYTHONPATH
# (offline: no index; no dependencies resolved; `python3`'s own packages, torch among them, are read but never
# replaced), checks that `python3` has what the carry was prepared for, then runs `benchmarks.gpu_report_measure`:
# part 1 (training, time_to_bleu, generation, correctness; 9 minutes) or, with --part 2, part 2 (profile, chunk_sweep,
# batch_sweep; 4 minutes), the sections in order of priority within the part's deadline counted from this script's
# start, each section's JSON and the page gpu.md (both parts' sections) written into OUTPUT_DIR as they are measured, so
# that a run cut off leaves everything measured until then. The arguments after OUTPUT_DIR go to gpu_report_measure.
set -euo pipefail
started=$(date +%s)
if [ $# -lt 1 ] || [[ $1 == -* ]]; then
    echo "usage: bash $0 OUTPUT_DIR [--part 2] [--device cpu --quick] [--section NAME ...]" >&2
    exit 2
fi
output=$1
shift
carry=$(cd "$(dirname "$0")" && pwd)
[ -f pyproject.toml ] && [ -d benchmarks ] || { echo "run.sh: run it from the root of the checkout" >&2; exit 2; }

site=$(mktemp -d "${TMPDIR:-/tmp}/vaswani-gpu-report-XXXXXX")
shopt -s nullglob
wheels=("$carry"/wheels/*.whl)
# The checkout is built in an isolated environment from the carried build/ wheels, whatever setuptools python3 has.
python3 -m pip install --quiet --disable-pip-version-check --no-index --find-links "$carry/build" --no-deps \
    --no-compile --target "$site" "${wheels[@]}" .
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
echo "run.sh: ${#wheels[@]} wheels and the checkout installed into $site in $(($(date +%s) - started)) s"

python3 -m benchmarks.gpu_report_prepare --check --carry_dir "$carry"
PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_report_measure --report_dir "$output" --corpus_dir "$carry/corpus" \
    --started_at "$started" "$@"
