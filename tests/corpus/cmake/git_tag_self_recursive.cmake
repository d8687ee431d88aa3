# expect: line=3 value=${FLASHMLA_REVISION} (recursive
set(FLASHMLA_REVISION "${FLASHMLA_REVISION}")
FetchContent_Declare(
  flashmla
  GIT_REPOSITORY https://github.com/vllm-project/FlashMLA.git
  GIT_TAG ${FLASHMLA_REVISION}
)
