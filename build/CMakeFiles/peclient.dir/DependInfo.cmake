
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/client/lib/builder.c" "CMakeFiles/peclient.dir/client/lib/builder.c.o" "gcc" "CMakeFiles/peclient.dir/client/lib/builder.c.o.d"
  "/work/main/client/lib/fashion_mnist.c" "CMakeFiles/peclient.dir/client/lib/fashion_mnist.c.o" "gcc" "CMakeFiles/peclient.dir/client/lib/fashion_mnist.c.o.d"
  "/work/main/client/lib/models.c" "CMakeFiles/peclient.dir/client/lib/models.c.o" "gcc" "CMakeFiles/peclient.dir/client/lib/models.c.o.d"
  "/work/main/client/lib/version.c" "CMakeFiles/peclient.dir/client/lib/version.c.o" "gcc" "CMakeFiles/peclient.dir/client/lib/version.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/CMakeFiles/pe_proto.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
