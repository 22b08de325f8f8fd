/* For the test_daemon_basic* suites: their client id, and a Register
 * request that must fail. The daemon itself is daemon_harness.h's. */
#ifndef PE_TESTS_DAEMON_BASIC_H
#define PE_TESTS_DAEMON_BASIC_H

#include <check.h>

#include "daemon_harness.h"

#define CLIENT 0x1001

/* Sending reg as a new request for CLIENT (a repeated request id would be
 * answered from the reply cache) fails with code/needle. */
static inline void register_fails(int s, Pe__RegisterRequest *reg, int code, const char *needle) {
  Pe__Request rq = dh_req(CLIENT);
  rq.body_case = PE__REQUEST__BODY_REGISTER;
  rq.register_ = reg;
  Pe__Reply *rep = dh_call(s, &rq);
  dh_err(rep, code, needle);
  pe__reply__free_unpacked(rep, NULL);
}

#endif
