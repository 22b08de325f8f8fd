file(REMOVE_RECURSE
  "CMakeFiles/pe_testcommon.dir/common/op_harness.c.o"
  "CMakeFiles/pe_testcommon.dir/common/op_harness.c.o.d"
  "libpe_testcommon.a"
  "libpe_testcommon.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/pe_testcommon.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
