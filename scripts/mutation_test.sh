#!/usr/bin/env bash
# Mutation testing of the model and the schedule with mutmut (the `dev` extra; configured in pyproject.toml's
# [tool.mutmut]). mutmut imports the mutated copies by their module names, while this repository's root is the package
# itself; so it runs in a staging folder where the repository is `vaswani/`, and keeps its state there between runs
# (a run can be stopped and continued). Arguments go to `mutmut run` (e.g. one mutant's name).
#   bash scripts/mutation_test.sh              then: cd "$MUTMUT_DIR" && mutmut results / mutmut show NAME
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stage=${MUTMUT_DIR:-${TMPDIR:-/tmp}/vaswani-mutmut}
mkdir -p "$stage"
ln -sfn "$repo" "$stage/vaswani"
ln -sfn "$repo/tests" "$stage/tests"
ln -sfn "$repo/pyproject.toml" "$stage/pyproject.toml"
cd "$stage"
# One thread per worker: mutmut runs one worker per core.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mutmut run "$@"
echo "results in $stage: cd $stage && mutmut results"
