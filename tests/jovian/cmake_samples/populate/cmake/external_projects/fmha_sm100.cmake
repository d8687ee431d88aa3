include(FetchContent)
FetchContent_Populate(
  fmha_sm100
  QUIET
  GIT_REPOSITORY https://github.com/example-lab/fmha-sm100.git
  GIT_TAG 5a5b5c5d5e5f505152535455565758595a5b5c5d
  SOURCE_DIR ${CMAKE_BINARY_DIR}/fmha_sm100
)
