FetchContent_Declare(deepselect
  GIT_REPOSITORY https://github.com/vllm-project/DeepSelect.git
  GIT_TAG d96d33afe1fab0d6066da49cdc91e64c2bee65ea)
