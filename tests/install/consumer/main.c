/* A trainer built against an installed libpeclient (pkg-config or
 * find_package(peclient)): it compiles with the installed headers, links the
 * installed library and runs. argv[1]: the version it must report. */
#include <stdio.h>
#include <string.h>

#include "pe_client.h"
#include "peclient_version.h"

int main(int argc, char **argv) {
  const char *v = pe_client_version();
  if (argc > 1 && strcmp(v, argv[1]) != 0) {
    fprintf(stderr, "libpeclient reports version %s, the install is %s\n", v, argv[1]);
    return 1;
  }
  printf("libpeclient %s\n", v);
  return 0;
}
