/* The rendezvous store of a job: a key-value store that rank 0 serves over
 * TCP and every rank (rank 0 included) reads and writes as a client.
 * Gloo's connectFullMesh exchanges the ranks' pair addresses through it.
 *
 * This Gloo (Debian's libgloo 0.5.0, 2022) has no TCP store: its FileStore
 * needs a file system all machines share, its HashStore lives in one process
 * and its RedisStore needs a Redis server. The store is small on purpose:
 * SET, a GET that waits for the key, and a HELLO that admits a rank.
 *
 * Admission: each client first says its job name, token, world size and
 * rank; the server refuses a client whose job, token or world size differs
 * from rank 0's, whose rank is out of range or already taken. A refusal
 * fails the rendezvous for every rank: pending and later GETs return the
 * reason, so nobody waits for a rank that will not come. Once the job
 * formed, the server refuses every rank that says hello (it comes late or
 * twice), and the refusal fails nobody else.
 *
 * The token is a shared secret compared at admission; it travels in clear
 * (the store keeps ranks of one job apart, it does not encrypt).
 *
 * C++ only (daemon/net/gloo_comm.cpp uses it); errors are thrown as
 * StoreRefused (a rank was refused admission) or std::runtime_error (the
 * store is unreachable, gone or timed out), messages ready for the user. */
#ifndef PE_NET_TCP_STORE_H
#define PE_NET_TCP_STORE_H

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace pe_net {

/* The rendezvous refused a rank (this one or another): job, token or world
 * size differ, or a rank is out of range or taken twice. */
struct StoreRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/* Who a client is, as it tells the server. */
struct StoreHello {
  std::string job;
  std::string token;
  int world_size;
  int rank;
};

/* Rank 0's side: listens on host:port, one thread per client. Stop() (or
 * the destructor) closes every connection and joins every thread. */
class StoreServer {
 public:
  StoreServer(const std::string &host, int port, const StoreHello &self);
  ~StoreServer();
  void Stop();
  /* Every rank joined and the job formed: the server stays up so that a
   * rank that comes now is told at once (refused, naming the job as
   * formed) instead of waiting for a rendezvous that will not happen. */
  void MarkFormed();

 private:
  void AcceptLoop();
  void Serve(int fd, std::string from);
  std::string Admit(const StoreHello &h, const std::string &from);
  void Fail(const std::string &reason);

  StoreHello self_;
  int listen_fd_ = -1;
  std::mutex mu_;  // guards everything below
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<bool> joined_;
  std::string failure_;  // empty while the rendezvous is healthy
  bool formed_ = false;
  bool stopping_ = false;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

/* Every rank's side: one connection to rank 0's server, admitted at
 * construction. Calls are serialized (Gloo calls the store from one thread). */
class StoreClient : public gloo::rendezvous::Store {
 public:
  StoreClient(const std::string &host, int port, const StoreHello &self,
              std::chrono::milliseconds timeout);
  ~StoreClient() override;

  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

 private:
  std::vector<char> Get(const std::string &key, std::chrono::milliseconds timeout);

  int fd_ = -1;
  std::string where_;  // "HOST:PORT", for messages
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace pe_net

#endif
