# Sourced by the study scripts: the model, a release build copied into the study directory (the
# study keeps using it while the tree changes), and `timed`.
#   needs DIR (the study directory); sets PBRL
scripts/fetch-model.sh
cargo build --release --quiet
mkdir -p "$DIR"
cp target/release/pbrl "$DIR/pbrl"
PBRL=$DIR/pbrl
timed() { # timed LOG COMMAND...: run, log stdout+stderr, print the wall seconds
  local log=$1; shift
  local start=$SECONDS
  "$@" > "$log" 2>&1
  echo $((SECONDS - start))
}
