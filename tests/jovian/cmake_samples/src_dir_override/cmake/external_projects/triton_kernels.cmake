if (DEFINED ENV{TRITON_KERNELS_SRC_DIR})
  FetchContent_Declare(triton_kernels SOURCE_DIR $ENV{TRITON_KERNELS_SRC_DIR})
else()
  FetchContent_Declare(triton_kernels
    GIT_REPOSITORY https://github.com/triton-lang/triton.git
    GIT_TAG v3.5.1)
endif()
