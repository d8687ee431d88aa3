# expect: line=2 value=v3.5.0..v3.5.1
set(_TRITON_TAG "v3.5.0..v3.5.1")
FetchContent_Declare(
  triton_kernels
  GIT_REPOSITORY https://github.com/triton-lang/triton.git
  GIT_TAG ${_TRITON_TAG}
)
