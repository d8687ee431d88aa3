FetchContent_Declare(tml_fa4
  GIT_REPOSITORY https://github.com/example-lab/tml-fa4.git
  GIT_TAG b2068346a1b2c3d4e5f60718293a4b5c6d7e8f90)
FetchContent_GetProperties(tml_fa4)
if(NOT tml_fa4_POPULATED)
  FetchContent_Populate(tml_fa4)
endif()
