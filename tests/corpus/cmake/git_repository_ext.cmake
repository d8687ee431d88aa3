# expect: line=4 value=ext::sh -c touch% /tmp/lockstep-pwned
FetchContent_Declare(
  triton_kernels
  GIT_REPOSITORY "ext::sh -c touch% /tmp/lockstep-pwned"
  GIT_TAG v3.5.1
  SOURCE_SUBDIR python/triton_kernels/triton_kernels
)
