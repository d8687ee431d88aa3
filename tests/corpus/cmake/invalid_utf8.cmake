# expect: line=3 value=0xe9
# FlashMLA: sm90/sm100 MLA decode kernels
# maintained by Jérôme (latin-1, not UTF-8)
FetchContent_Declare(
  flashmla
  GIT_REPOSITORY https://github.com/vllm-project/FlashMLA
  GIT_TAG a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0
)
