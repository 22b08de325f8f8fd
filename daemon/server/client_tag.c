/* Client tags for the log (see client_tag.h). */
#include "server/client_tag.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t key[2];
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void key_draw(void) {
  if (getrandom(key, sizeof key, 0) != (ssize_t)sizeof key) {
    /* No entropy: the tag still does not give the id back (it keeps 32 of
     * its 64 bits), it only becomes checkable against a guess. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    key[0] = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec;
    key[1] = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
  }
}

/* A 64-bit mixer (multiply, xor-shift) with every output bit depending on
 * every input bit. */
static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

pe_client_tag_buf pe_client_tag(uint64_t client) {
  pthread_once(&key_once, key_draw);
  uint64_t h = mix(mix(client ^ key[0]) + key[1]);
  pe_client_tag_buf b;
  snprintf(b.s, sizeof b.s, "c-%08x", (unsigned)(h >> 32));
  return b;
}
