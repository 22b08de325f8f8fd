file(REMOVE_RECURSE
  "CMakeFiles/peclient.dir/client/lib/builder.c.o"
  "CMakeFiles/peclient.dir/client/lib/builder.c.o.d"
  "CMakeFiles/peclient.dir/client/lib/fashion_mnist.c.o"
  "CMakeFiles/peclient.dir/client/lib/fashion_mnist.c.o.d"
  "CMakeFiles/peclient.dir/client/lib/models.c.o"
  "CMakeFiles/peclient.dir/client/lib/models.c.o.d"
  "CMakeFiles/peclient.dir/client/lib/version.c.o"
  "CMakeFiles/peclient.dir/client/lib/version.c.o.d"
  "libpeclient.a"
  "libpeclient.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/peclient.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
