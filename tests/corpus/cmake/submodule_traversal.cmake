# expect: line=6 value=../../../escape
FetchContent_Declare(
  deepgemm
  GIT_REPOSITORY https://github.com/deepseek-ai/DeepGEMM.git
  GIT_TAG 8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5
  GIT_SUBMODULES "third-party/cutlass" "../../../escape"
)
