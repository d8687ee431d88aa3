if(USE_ROCM)
  FetchContent_Declare(vllm-flash-attn
    GIT_REPOSITORY https://github.com/ROCm/flash-attention.git
    GIT_TAG 1111111111111111111111111111111111111111)
elseif(VLLM_GPU_LANG STREQUAL "CUDA" AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  FetchContent_Declare(vllm-flash-attn
    GIT_REPOSITORY https://github.com/vllm-project/flash-attention.git
    GIT_TAG f3e1a4f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1)
else()
  FetchContent_Declare(vllm-flash-attn
    GIT_REPOSITORY https://github.com/vllm-project/flash-attention.git
    GIT_TAG 2222222222222222222222222222222222222222)
endif()
