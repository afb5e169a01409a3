#!/usr/bin/env bash
# GPU report, step 2 of 2: one part of the report, on a GPU machine without network access, from the checkout's root.
#
#   bash CARRY/run.sh OUTPUT_DIR [--part 2] [--device cpu --quick] [--section NAME ...]
#
# Installs CARRY's wheels (benchmarks.gpu_report_prepare's) and the checkout offline, without dependencies, into a
# folder first on PYTHONPATH (python3's own packages, torch among them, are never replaced), checks python3 against the
# carry, then runs benchmarks.gpu_report_measure with the arguments after OUTPUT_DIR, its deadline counted from this
# script's start: each section's JSON and gpu.md go into OUTPUT_DIR as they are measured.
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
trap 'rm -rf "$site"' EXIT  # 80 MB of installed wheels a run: gone when the run ends, however it ends
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
