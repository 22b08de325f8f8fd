file(REMOVE_RECURSE
  "libpeclient.a"
)
