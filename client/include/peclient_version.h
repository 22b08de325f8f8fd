/* Version of libpeclient (the trainer-side library). */
#ifndef PE_CLIENT_VERSION_H
#define PE_CLIENT_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif
const char *pe_client_version(void);
#ifdef __cplusplus
}
#endif

#endif
