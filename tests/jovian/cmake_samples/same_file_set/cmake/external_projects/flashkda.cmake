include(FetchContent)

set(_FLASHKDA_OWNER "vllm-project")
set(_FLASHKDA_UPSTREAM_REPO "https://github.com/${_FLASHKDA_OWNER}/FlashKDA.git")
set(_FLASHKDA_UPSTREAM_TAG "3b225bf26bb8e218928a1fe14751cb48cf31d11b")

FetchContent_Declare(
  flashkda
  GIT_REPOSITORY ${_FLASHKDA_UPSTREAM_REPO}
  GIT_TAG ${_FLASHKDA_UPSTREAM_TAG}
  GIT_SUBMODULES cutlass
)

# A later set() does not reach the declare above.
set(_FLASHKDA_UPSTREAM_TAG "ffffffffffffffffffffffffffffffffffffffff")
