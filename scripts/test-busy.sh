#!/usr/bin/env bash
# `make test` with two CPU-burning processes beside it: the suite must pass on a busy 2-core
# machine (every wait is a condition with a deadline, never a fixed time). The burners stop
# when the run ends, however it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
burners=()
for _ in 1 2; do
    python3 -c 'while True: pass' &
    burners+=("$!")
done
trap 'kill "${burners[@]}" 2>/dev/null || true' EXIT
make test PYTEST_ARGS="${PYTEST_ARGS:-}"
