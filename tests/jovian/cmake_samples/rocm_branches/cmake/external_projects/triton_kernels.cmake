set(DEFAULT_TRITON_KERNELS_TAG "v3.5.1")

if(VLLM_GPU_LANG STREQUAL "HIP")
  set(TRITON_GIT "https://github.com/ROCm/triton.git")
else()
  set(TRITON_GIT "https://github.com/triton-lang/triton.git")
endif()

FetchContent_Declare(
  triton_kernels
  GIT_REPOSITORY ${TRITON_GIT}
  GIT_TAG ${DEFAULT_TRITON_KERNELS_TAG}
  SOURCE_SUBDIR python/triton_kernels/triton_kernels
)
