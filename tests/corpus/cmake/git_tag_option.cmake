# expect: line=5 value=--force
FetchContent_Declare(
  deepselect
  GIT_REPOSITORY https://github.com/example-lab/DeepSelect.git
  GIT_TAG --force
)
