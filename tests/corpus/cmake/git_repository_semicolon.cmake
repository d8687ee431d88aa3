# expect: line=4 value=file:///srv/git/flashmla.git
FetchContent_Declare(
  flashmla
  GIT_REPOSITORY "file:///srv/git/flashmla.git;touch /tmp/lockstep-pwned"
  GIT_TAG a8f794d1f2e3d4c5b6a79881726354f4e3d2c1b0
)
