#!/usr/bin/env bash
# Build a CUDA_HOME from PyPI's CUDA 13 wheels, enough to compile candle's `cuda` feature on a
# machine without a GPU (the tested recipe of shared/spec/cuda-build.md).
# usage: mk-cuda-home.sh <venv> <cuda_home> [full|min]
#   full: can LINK the cuda feature (adds cublas, curand, nvrtc); min: enough for `cargo check`
set -euo pipefail
VENV=$1; H=$2; MODE=${3:-full}
PKGS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)   # pin ALL: nvcc's deps are unpinned
[ "$MODE" = full ] && PKGS+=(nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88)
[ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "${PKGS[@]}"
C=$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
rm -rf "$H"; mkdir -p "$H/bin" "$H/lib64/stubs"
ln -s "$C/include" "$H/include"; ln -s "$C/nvvm" "$H/nvvm"
for f in "$C"/bin/*; do ln -s "$f" "$H/bin/"; done
# nvcc finds nvcc.profile from its real path; copies make TOP=$H so lib64/ resolves.
rm "$H/bin/nvcc" "$H/bin/nvcc.profile"; cp "$C/bin/nvcc" "$C/bin/nvcc.profile" "$H/bin/"
for f in "$C"/lib/*; do
  b=$(basename "$f"); ln -s "$f" "$H/lib64/$b"
  case $b in *.so.*) [ -e "$H/lib64/${b%%.so.*}.so" ] || ln -s "$f" "$H/lib64/${b%%.so.*}.so";; esac
done
# No wheel ships libcuda.so: generate a link-time stub (soname libcuda.so.1) from cuda.h.
# Never put stubs/ on LD_LIBRARY_PATH at run time.
python3 - "$H" <<'PY'
import re, subprocess, sys, pathlib
h = pathlib.Path(sys.argv[1]); hdr = h / "include" / "cuda.h"; out = h / "lib64/stubs/libcuda.so"
text = hdr.read_text(errors="replace")
names = set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", text)) | set(re.findall(r"#define\s+cu[A-Z]\w*\s+(cu[A-Z]\w*)\b", text))
for extra in ([], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]):
    pre = subprocess.run(["gcc", "-E", "-P", "-x", "c", *extra, f"-I{h/'include'}", str(hdr)],
                         capture_output=True, text=True, check=True).stdout
    names |= set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", pre))
src = out.with_suffix(".c"); src.write_text("".join(f"void {n}(void) {{}}\n" for n in sorted(names)))
subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), "-Wl,-soname,libcuda.so.1"], check=True)
print(f"libcuda stub: {len(names)} symbols")
PY
"$H/bin/nvcc" --version | tail -2
