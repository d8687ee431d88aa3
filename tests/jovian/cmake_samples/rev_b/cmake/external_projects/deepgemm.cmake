# r39: DeepGEMM moved to the vllm-project fork.
set(_DEEPGEMM_UPSTREAM_REPO "https://github.com/vllm-project/DeepGEMM.git")
set(_DEEPGEMM_UPSTREAM_TAG "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00")
FetchContent_Declare(
  deepgemm
  GIT_REPOSITORY ${_DEEPGEMM_UPSTREAM_REPO}
  GIT_TAG ${_DEEPGEMM_UPSTREAM_TAG}
  GIT_SUBMODULES "third-party/cutlass" "third-party/deep_jit"
)
