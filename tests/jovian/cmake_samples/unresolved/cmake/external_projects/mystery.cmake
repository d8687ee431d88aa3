FetchContent_Declare(mystery
  GIT_REPOSITORY https://github.com/$ENV{MYSTERY_OWNER}/mystery.git
  GIT_TAG ${NOPE})
