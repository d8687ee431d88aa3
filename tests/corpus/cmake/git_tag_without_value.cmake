# expect: line=7 value=GIT_TAG
include(FetchContent)

FetchContent_Declare(
  flashmla
  GIT_REPOSITORY https://github.com/vllm-project/FlashMLA
  GIT_TAG
  GIT_PROGRESS TRUE
)
FetchContent_MakeAvailable(flashmla)
