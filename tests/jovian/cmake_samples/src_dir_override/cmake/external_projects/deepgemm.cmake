# DEEPGEMM_SRC_DIR (environment or -D) builds from a local tree instead of downloading.
if (DEFINED ENV{DEEPGEMM_SRC_DIR})
  set(DEEPGEMM_SRC_DIR $ENV{DEEPGEMM_SRC_DIR})
endif()

if(DEEPGEMM_SRC_DIR)
  FetchContent_Declare(
    deepgemm
    SOURCE_DIR ${DEEPGEMM_SRC_DIR}
    CONFIGURE_COMMAND ""
    BUILD_COMMAND ""
  )
else()
  FetchContent_Declare(
    deepgemm
    GIT_REPOSITORY https://github.com/deepseek-ai/DeepGEMM.git
    GIT_TAG 8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5
    GIT_SUBMODULES "third-party/cutlass" "third-party/deep_jit"
  )
endif()
