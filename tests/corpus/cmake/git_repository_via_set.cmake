# expect: line=4 value=-oProxyCommand=touch /tmp/lockstep-pwned
include(FetchContent)

set(_FLASHKDA_UPSTREAM_REPO "-oProxyCommand=touch /tmp/lockstep-pwned")
set(_FLASHKDA_UPSTREAM_TAG "3b225bf26bb8e218928a1fe14751cb48cf31d11b")

FetchContent_Declare(
  flashkda
  GIT_REPOSITORY ${_FLASHKDA_UPSTREAM_REPO}
  GIT_TAG ${_FLASHKDA_UPSTREAM_TAG}
)
