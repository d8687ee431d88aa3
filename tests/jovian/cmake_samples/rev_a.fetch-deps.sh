#!/usr/bin/env bash
# fetch-deps.sh (r35 era): clone every vLLM build sub-dependency at the pin the tree declares.
set -euo pipefail

gate() {  # gate NAME REPOSITORY TAG [SUBDIR...]
  local name=$1 repo=$2 tag=$3; shift 3
  grep -rq "$tag" "$VLLM_SRC/cmake" "$VLLM_SRC/CMakeLists.txt" || { echo "pin $name@$tag not in the tree" >&2; exit 1; }
  clone_at "$name" "$repo" "$tag" "$@"
}

# top-level cutlass: keep it at the tree's declared tag, NOT the dep-gitlink ones
gate cutlass https://github.com/NVIDIA/cutlass v4.4.2
gate flashmla https://github.com/vllm-project/FlashMLA.git a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0 csrc/cutlass
  gate DeepGEMM https://github.com/deepseek-ai/DeepGEMM 8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5 \
      third-party/cutlass third-party/fmt
gate triton_kernels https://github.com/triton-lang/triton.git v3.5.1  # python/triton_kernels only
gate qutlass https://github.com/IST-DASLab/qutlass.git e74319e3a1b2c3d4e5f60718293a4b5c6d7e8f90 third_party/cutlass
gate tilelang https://github.com/tile-ai/tilelang.git 0123456789abcdef0123456789abcdef01234567

populate_gitlinks "$DEPS"
