file(REMOVE_RECURSE
  "libpe_testcommon.a"
)
