# expect: line=2 value=endif
if(VLLM_GPU_LANG STREQUAL "HIP")
  set(TRITON_GIT "https://github.com/ROCm/triton.git")
else()
  set(TRITON_GIT "https://github.com/triton-lang/triton.git")
FetchContent_Declare(
  triton_kernels
  GIT_REPOSITORY ${TRITON_GIT}
  GIT_TAG v3.5.1
)
