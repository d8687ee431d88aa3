include(FetchContent)

# An older pin stays in this comment and must not be read:
# GIT_TAG 0000000000000000000000000000000000000000
#[[ a bracket comment spanning lines
FetchContent_Declare(ghost GIT_REPOSITORY https://example.invalid/ghost.git GIT_TAG v0)
]]
FetchContent_Declare(
  qutlass
  GIT_REPOSITORY "https://github.com/IST-DASLab/qutlass.git"   # quoted
  GIT_TAG
      e74319e3a1b2c3d4e5f60718293a4b5c6d7e8f90  # unquoted, on its own line
  GIT_PROGRESS TRUE
  CONFIGURE_COMMAND ""
  BUILD_COMMAND ""
)

FetchContent_Declare(flashmla GIT_REPOSITORY https://github.com/vllm-project/FlashMLA GIT_TAG a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0)
message(STATUS "qutlass is at ${qutlass_SOURCE_DIR} (GIT_TAG is not read from messages)")
