/* Version of libpeclient (the trainer-side library). */
#ifndef PE_CLIENT_VERSION_H
#define PE_CLIENT_VERSION_H
const char *pe_client_version(void);
#endif
