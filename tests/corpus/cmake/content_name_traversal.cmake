# expect: line=3 value=../../escape
FetchContent_Declare(
  ../../escape
  GIT_REPOSITORY https://github.com/vllm-project/FlashMLA
  GIT_TAG a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0
)
