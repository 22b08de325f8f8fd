#include "peclient_version.h"

const char *pe_client_version(void) { return "0.1.0"; }
