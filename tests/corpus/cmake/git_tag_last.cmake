# expect: line=5 value=GIT_TAG
FetchContent_Declare(
  qutlass
  GIT_REPOSITORY https://github.com/IST-DASLab/qutlass.git
  GIT_TAG)
