file(REMOVE_RECURSE
  "libpe.a"
)
