# expect: line=6 value=/etc/lockstep-escape
set(_MSA_GITLINKS "csrc/cutlass;/etc/lockstep-escape")
FetchContent_Declare(msa
  GIT_REPOSITORY https://github.com/example-lab/MSA.git
  GIT_TAG 087c1618a1b2c3d4e5f60718293a4b5c6d7e8f90
  GIT_SUBMODULES ${_MSA_GITLINKS})
