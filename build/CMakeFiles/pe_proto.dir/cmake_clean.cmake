file(REMOVE_RECURSE
  "CMakeFiles/pe_proto.dir/proto/program.pb-c.c.o"
  "CMakeFiles/pe_proto.dir/proto/program.pb-c.c.o.d"
  "libpe_proto.a"
  "libpe_proto.pdb"
  "proto/program.pb-c.c"
  "proto/program.pb-c.h"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/pe_proto.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
