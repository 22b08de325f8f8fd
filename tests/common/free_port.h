/* A free TCP port for tests that need a known address: the suites that
 * start a daemon or a job on 127.0.0.1. Header-only. */
#ifndef PE_TESTS_FREE_PORT_H
#define PE_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* A free TCP port on 127.0.0.1 (the kernel's pick, released again). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

#endif
