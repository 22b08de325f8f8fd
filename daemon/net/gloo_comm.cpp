/* The Gloo communicator (gloo_comm.h). Gloo reports every failure by
 * throwing; each extern "C" function catches everything and turns it into a
 * pe_status, so that nothing escapes into C and nothing aborts. */
extern "C" {
#include "core/status.h"
}
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "net/gloo_comm.h"
#include "net/gloo_peers.h"
#include "net/tcp_store.h"

namespace {

constexpr size_t kSharedMax = 64 << 10;  // a pe_gloo_shared value's bytes at most

/* Rank 0 publishes its shared value under the job's prefix; every other
 * rank reads it (waiting for it up to the store's timeout) and refuses one
 * of another length. */
void ExchangeShared(gloo::rendezvous::Store &store, const pe_gloo_opts *o) {
  const pe_gloo_shared *sh = o->shared;
  if (!sh) return;
  std::string key = std::string("pe-shared.") + sh->key;
  if (o->rank == 0) {
    const char *v = static_cast<const char *>(sh->value);
    store.set(key, std::vector<char>(v, v + sh->len));
    memcpy(sh->out, sh->value, sh->len);
    return;
  }
  std::vector<char> got = store.get(key);
  if (got.size() != sh->len)
    throw pe_net::StoreRefused("rank 0's shared '" + std::string(sh->key) + "' is " +
                               std::to_string(got.size()) + " bytes, rank " +
                               std::to_string(o->rank) + " expects " + std::to_string(sh->len) +
                               " (the nodes run different builds or settings)");
  memcpy(sh->out, got.data(), sh->len);
}

/* "HOST:PORT" or "[V6ADDR]:PORT"; false when malformed. */
bool SplitHostPort(const char *s, std::string *host, int *port) {
  std::string hp(s);
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size()) return false;
  std::string h = hp.substr(0, colon), p = hp.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  for (char ch : p)
    if (!isdigit(static_cast<unsigned char>(ch))) return false;
  long v = strtol(p.c_str(), nullptr, 10);
  if (p.size() > 5 || v < 1 || v > 65535 || h.empty()) return false;
  *host = h;
  *port = static_cast<int>(v);
  return true;
}

/* Gloo writes to its sockets with writev(2), which raises SIGPIPE when the
 * peer has died; its default action ends the process. A process that left
 * SIGPIPE at the default gets it ignored (the write then fails with EPIPE
 * and Gloo reports it); a handler someone installed stays. */
void IgnoreSigpipe() {
  struct sigaction old;
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO))
    signal(SIGPIPE, SIG_IGN);
}

}  // namespace

struct pe_gloo_comm {
  std::string job;
  int rank = 0;
  int size = 0;
  std::chrono::milliseconds timeout{PE_GLOO_DEFAULT_TIMEOUT_MS};
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  pe_net::PeerLinks peers;
  // Rank 0's: stays up while the job lives, refusing the ranks that come
  // late or twice at once (tcp_store.h); stopped before ctx closes.
  std::unique_ptr<pe_net::StoreServer> server;
  std::string failure;  // the first failed collective's message; "" while healthy

  /* Records the failure (the communicator is broken after it) and returns
   * it: the peers that are gone first (the likely cause: a peer that only
   * stalls because another died is not gone), then Gloo's error with the
   * rank its address belongs to. */
  pe_status *Failed(pe_code code, const std::string &op, const std::string &what) {
    std::string lost;
    std::vector<int> gone = peers.Gone();
    for (size_t i = 0; i < gone.size(); i++) lost += (i ? ", " : "") + std::to_string(gone[i]);
    if (!lost.empty())
      lost = std::string(gone.size() > 1 ? "lost peer ranks " : "lost peer rank ") + lost +
             " (connection closed); ";
    // A timeout names no peer: every connection is open, so one of the
    // others stalls (stopped, overloaded, or its link drops packets).
    std::string stalled;
    if (gone.empty() && what.find("Timed out") != std::string::npos && size > 1) {
      std::string others;
      for (int r = 0, k = 0; r < size; r++)
        if (r != rank) others += (k++ ? ", " : "") + std::to_string(r);
      stalled = size == 2
                    ? " (peer rank " + others + " stalls: its connection is open)"
                    : " (one of peer ranks " + others + " stalls: their connections are open)";
    }
    failure = "job '" + job + "' rank " + std::to_string(rank) + ": " + op + " failed: " + lost +
              peers.RankIn(what) + what + stalled;
    return pe_error(code, "%s", failure.c_str());
  }

  pe_status *Broken() const {
    return pe_error(PE_EIO, "job '%s' rank %d: the communicator failed earlier: %s", job.c_str(),
                    rank, failure.c_str());
  }

  template <typename F>
  pe_status *Run(const std::string &op, F body) {
    if (!failure.empty()) return Broken();
    try {
      body();
      return nullptr;
    } catch (const pe_net::StoreRefused &e) {
      return Failed(PE_EINVAL, op, e.what());
    } catch (const gloo::IoException &e) {
      return Failed(PE_EIO, op, e.what());
    } catch (const gloo::Exception &e) {
      return Failed(PE_EBACKEND, op, e.what());
    } catch (const std::bad_alloc &) {
      return Failed(PE_ENOMEM, op, "out of memory");
    } catch (const std::runtime_error &e) {  // the store: unreachable, gone, timed out
      return Failed(PE_EIO, op, e.what());
    } catch (const std::exception &e) {
      return Failed(PE_EBACKEND, op, e.what());
    } catch (...) {
      return Failed(PE_EINTERNAL, op, "unknown exception");
    }
  }
};

static pe_status *check_opts(const pe_gloo_opts *o, std::string *host, int *port) {
  if (!o) return pe_error(PE_EINVAL, "gloo communicator: no options");
  const char *job = o->job ? o->job : "";
  if (!*job || strlen(job) > 128 || strchr(job, '/'))
    return pe_error(PE_EINVAL,
                    "gloo communicator: job name '%s' must be 1..128 characters without '/'", job);
  if (!o->token || !*o->token)
    return pe_error(PE_EINVAL, "gloo communicator: job '%s' has no token (the shared secret)", job);
  if (o->world_size < 1)
    return pe_error(PE_EINVAL, "gloo communicator: job '%s': world size %d is below 1", job,
                    o->world_size);
  if (o->rank < 0 || o->rank >= o->world_size)
    return pe_error(PE_EINVAL, "gloo communicator: job '%s': rank %d is outside 0..%d", job,
                    o->rank, o->world_size - 1);
  if (o->timeout_ms < 0)
    return pe_error(PE_EINVAL, "gloo communicator: job '%s': timeout %d ms is negative", job,
                    o->timeout_ms);
  if (const pe_gloo_shared *sh = o->shared) {
    const char *k = sh->key ? sh->key : "";
    size_t kl = strlen(k);
    bool ok = kl >= 1 && kl <= 64;
    for (size_t i = 0; ok && i < kl; i++)
      ok = isalnum(static_cast<unsigned char>(k[i])) || strchr("_.-", k[i]);
    if (!ok)
      return pe_error(PE_EINVAL,
                      "gloo communicator: job '%s': shared key '%s' must be 1..64 characters of "
                      "[A-Za-z0-9_.-]",
                      job, k);
    if (sh->len < 1 || sh->len > kSharedMax || !sh->out || (o->rank == 0 && !sh->value))
      return pe_error(PE_EINVAL,
                      "gloo communicator: job '%s': shared '%s' of %zu bytes (1..%zu) needs an "
                      "output buffer%s",
                      job, k, sh->len, kSharedMax, o->rank == 0 ? " and rank 0's value" : "");
  }
  if (!o->rendezvous || !SplitHostPort(o->rendezvous, host, port))
    return pe_error(PE_EINVAL,
                    "gloo communicator: job '%s': rendezvous '%s' is not HOST:PORT (port 1..65535)",
                    job, o->rendezvous ? o->rendezvous : "");
  return nullptr;
}

extern "C" pe_status *pe_gloo_comm_new(const pe_gloo_opts *o, pe_gloo_comm **out) {
  *out = nullptr;
  std::string host;
  int port = 0;
  PE_TRY(check_opts(o, &host, &port));
  std::unique_ptr<pe_gloo_comm> c;
  try {
    c.reset(new pe_gloo_comm());
  } catch (...) {
    return pe_error(PE_ENOMEM, "gloo communicator: out of memory");
  }
  c->job = o->job;
  c->rank = o->rank;
  c->size = o->world_size;
  if (o->timeout_ms > 0) c->timeout = std::chrono::milliseconds(o->timeout_ms);
  IgnoreSigpipe();
  pe_status *st = c->Run("joining at rendezvous " + std::string(o->rendezvous), [&] {
    gloo::transport::tcp::attr attr;
    if (o->iface) attr.iface = o->iface;
    if (o->host) attr.hostname = o->host;
    auto dev = gloo::transport::tcp::CreateDevice(attr);

    pe_net::StoreHello self{o->job, o->token, o->world_size, o->rank};
    std::unique_ptr<pe_net::StoreServer> server;
    if (o->rank == 0) server.reset(new pe_net::StoreServer(host, port, self));
    pe_net::StoreClient client(host, port, self, c->timeout);
    gloo::rendezvous::PrefixStore store(c->job, client);

    auto ctx = std::make_shared<gloo::rendezvous::Context>(o->rank, o->world_size);
    ctx->setTimeout(c->timeout);
    ctx->connectFullMesh(store, dev);
    c->peers.Find(store, c->rank, c->size);
    // After the mesh: a rank that refuses the value closes its pairs, so
    // the others' barrier fails at once instead of at the timeout.
    ExchangeShared(store, o);
    // Every rank has read the store once all have connected: the job is
    // formed.
    gloo::BarrierOptions b(ctx);
    b.setTimeout(c->timeout);
    gloo::barrier(b);
    if (server) server->MarkFormed();
    c->ctx = ctx;
    c->server = std::move(server);
  });
  if (st) return st;
  *out = c.release();
  return nullptr;
}

/* Sums buf[0..n) over the ranks, in place. */
static pe_status *allreduce(pe_gloo_comm *c, float *buf, size_t n, const std::string &what) {
  return c->Run("all-reduce of " + what, [&] {
    gloo::AllreduceOptions opts(c->ctx);
    opts.setOutput(buf, n);
    void (*sum)(void *, const void *, const void *, size_t) = &gloo::sum<float>;
    opts.setReduceFunction(sum);
    opts.setTimeout(c->timeout);
    gloo::allreduce(opts);
  });
}

extern "C" pe_status *pe_gloo_allreduce_f32(pe_gloo_comm *c, float *buf, size_t n) {
  if (!c) return pe_error(PE_EINVAL, "gloo all-reduce: no communicator");
  if (n == 0) return nullptr;
  if (!buf)
    return pe_error(PE_EINVAL, "job '%s' rank %d: all-reduce of %zu floats in NULL", c->job.c_str(),
                    c->rank, n);
  return allreduce(c, buf, n, std::to_string(n) + " floats");
}

extern "C" pe_status *pe_gloo_allreduce_f32_many(pe_gloo_comm *c, float *const *bufs,
                                                 const size_t *ns, size_t nbufs) {
  if (!c) return pe_error(PE_EINVAL, "gloo all-reduce: no communicator");
  size_t total = 0;
  for (size_t i = 0; i < nbufs; i++) {
    if (ns[i] && !bufs[i])
      return pe_error(PE_EINVAL, "job '%s' rank %d: all-reduce: buffer %zu of %zu is NULL",
                      c->job.c_str(), c->rank, i, nbufs);
    total += ns[i];
  }
  if (total == 0) return nullptr;
  // Gloo's several outputs are summed together as well (one per local
  // device); separate tensors travel packed in one buffer instead.
  std::vector<float> packed;
  try {
    packed.resize(total);
  } catch (...) {
    return pe_error(PE_ENOMEM, "job '%s' rank %d: all-reduce: no memory to pack %zu floats",
                    c->job.c_str(), c->rank, total);
  }
  size_t at = 0;
  for (size_t i = 0; i < nbufs; at += ns[i], i++)
    if (ns[i]) memcpy(packed.data() + at, bufs[i], ns[i] * sizeof(float));
  PE_TRY(allreduce(c, packed.data(), total,
                   std::to_string(nbufs) + " buffers (" + std::to_string(total) + " floats)"));
  at = 0;
  for (size_t i = 0; i < nbufs; at += ns[i], i++)
    if (ns[i]) memcpy(bufs[i], packed.data() + at, ns[i] * sizeof(float));
  return nullptr;
}

extern "C" pe_status *pe_gloo_broadcast(pe_gloo_comm *c, void *buf, size_t bytes, int root) {
  if (!c) return pe_error(PE_EINVAL, "gloo broadcast: no communicator");
  if (root < 0 || root >= c->size)
    return pe_error(PE_EINVAL, "job '%s' rank %d: broadcast root %d is outside 0..%d",
                    c->job.c_str(), c->rank, root, c->size - 1);
  if (bytes == 0) return nullptr;
  if (!buf)
    return pe_error(PE_EINVAL, "job '%s' rank %d: broadcast of %zu bytes into NULL", c->job.c_str(),
                    c->rank, bytes);
  return c->Run(
      "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root), [&] {
        gloo::BroadcastOptions opts(c->ctx);
        opts.setOutput(static_cast<uint8_t *>(buf), bytes);
        opts.setRoot(root);
        opts.setTimeout(c->timeout);
        gloo::broadcast(opts);
      });
}

extern "C" int pe_gloo_comm_rank(const pe_gloo_comm *c) {
  return c->rank;
}
extern "C" int pe_gloo_comm_size(const pe_gloo_comm *c) {
  return c->size;
}

extern "C" void pe_gloo_comm_free(pe_gloo_comm *c) {
  try {
    delete c;
  } catch (...) {
    // Closing pairs to dead peers may throw; the memory is gone either way.
  }
}
