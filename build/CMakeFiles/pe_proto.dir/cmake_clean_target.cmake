file(REMOVE_RECURSE
  "libpe_proto.a"
)
