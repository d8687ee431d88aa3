# expect: line=4 value=GIT_REPOSITORY
FetchContent_Declare(
  qutlass
  GIT_REPOSITORY ""
  GIT_TAG e74319e3a1b2c3d4e5f60718293a4b5c6d7e8f90
)
