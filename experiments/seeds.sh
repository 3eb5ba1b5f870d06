#!/usr/bin/env bash
# One job of the README's Results table over several seeds: scripts/quickstart.sh once per seed
# (each in its own run directory, one thread each, two at a time on a 2-core machine), then
# scripts/summarize_runs.py: per seed the eval reward before and after with the gain paired by prompt,
# and the mean gain over seeds ± its standard error over seeds.
#   SEEDS="1 2 3" (default)  DIR=runs/seeds-<UTC time>  JOBS=2  CONFIG, ALGORITHM: as for
#   scripts/quickstart.sh; KEY=VALUE arguments go to every stage of every seed.
# A seed whose run directory exists is not run again, so a cut experiment resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-1 2 3}; JOBS=${JOBS:-2}
DIR=${DIR:-runs/seeds-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$DIR"
scripts/fetch-model.sh
cargo build --release --quiet
# The binary copied, so that a tree changing under a long experiment does not change it.
cmp -s target/release/pbrl "$DIR/pbrl" || cp target/release/pbrl "$DIR/pbrl"
export PBRL_BIN="$(cd "$DIR" && pwd)/pbrl" PBRL_THREADS=1
running=0
for seed in $SEEDS; do
  [ -f "$DIR/seed$seed/logs/done" ] && continue
  rm -rf "$DIR/seed$seed"
  ( RUN_DIR=$DIR/seed$seed scripts/quickstart.sh seed="$seed" "$@" > "$DIR/seed$seed.log" 2>&1 \
      && touch "$DIR/seed$seed/logs/done" ) &
  running=$((running + 1))
  if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait
python3 scripts/summarize_runs.py $(for seed in $SEEDS; do echo "$DIR/seed$seed"; done)
