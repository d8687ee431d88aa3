set(DEEPGEMM_TAG 8b1392b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5)
FetchContent_Declare(deepgemm GIT_REPOSITORY https://github.com/deepseek-ai/DeepGEMM.git GIT_TAG ${DEEPGEMM_TAG})
