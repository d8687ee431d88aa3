FetchContent_Declare(
  cutlass_fa3
  GIT_REPOSITORY https://github.com/nvidia/cutlass.git
  GIT_TAG ${CUTLASS_REVISION}
)
