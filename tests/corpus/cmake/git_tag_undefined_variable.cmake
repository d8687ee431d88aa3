# expect: line=2 value=${FLASHMLA_REVISION} (set nowhere
FetchContent_Declare(
  flashmla
  GIT_REPOSITORY https://github.com/vllm-project/FlashMLA.git
  GIT_TAG ${FLASHMLA_REVISION}
)
