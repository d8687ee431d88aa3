# expect: line=4 value=--upload-pack=${FLASHMLA_HOOK}
FetchContent_Declare(
  flashmla
  GIT_REPOSITORY "--upload-pack=${FLASHMLA_HOOK}"
  GIT_TAG a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0
)
