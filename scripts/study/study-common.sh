# Sourced by the study scripts: the model, a release build copied into the study directory (the
# study keeps using it while the tree changes; copied only when it changed, so a second study
# job on the same directory does not replace the binary a first one is running), and `timed`.
#   needs DIR (the study directory); sets PBRL
scripts/fetch-model.sh
cargo build --release --quiet
mkdir -p "$DIR"
cmp -s target/release/pbrl "$DIR/pbrl" || cp target/release/pbrl "$DIR/pbrl"
PBRL=$DIR/pbrl
timed() { # timed LOG COMMAND...: run, log stdout+stderr, print the wall seconds; a failed
  # command fails it (call it as `t=$(timed ...)`, so that `set -e` stops the study there and
  # a failed run is never marked done)
  local log=$1; shift
  local start=$SECONDS
  if ! "$@" > "$log" 2>&1; then
    echo "failed: $* (see $log)" >&2
    return 1
  fi
  echo $((SECONDS - start))
}
