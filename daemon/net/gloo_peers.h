/* Which rank each of Gloo's TCP connections leads to.
 *
 * Gloo's errors name a failed pair by its peer's socket address
 * ("Connection closed by peer [10.0.0.2]:4711"), not by rank, and the pair
 * keeps that address to itself. Right after connectFullMesh this reads it
 * back: every pair listens on an address its rank publishes in the store;
 * the side that connects has that address as its socket's peer, the side
 * that accepts has it as its socket's own name. Scanning this process's
 * connected TCP sockets (/proc/self/fd) against the published addresses
 * gives, for each peer rank, the address string Gloo's errors carry.
 *
 * It also keeps a duplicate of each pair's socket: Gloo closes a pair's
 * socket when the pair fails, the duplicate keeps the connection (and its
 * hang-up state) until the links are freed. So a rank whose collective
 * failed does not look gone to the others while it holds its communicator,
 * and Gone() tells a peer that died (its connection closed) from one that
 * is merely slow or stuck.
 *
 * C++ only (daemon/net/gloo_comm.cpp). */
#ifndef PE_NET_GLOO_PEERS_H
#define PE_NET_GLOO_PEERS_H

#include <gloo/rendezvous/store.h>

#include <string>
#include <vector>

namespace pe_net {

class PeerLinks {
 public:
  PeerLinks() = default;
  PeerLinks(const PeerLinks &) = delete;
  PeerLinks &operator=(const PeerLinks &) = delete;
  ~PeerLinks();

  /* Reads the published addresses from store (the one connectFullMesh
   * used; it must still answer) and finds the sockets. Throws only what
   * the store throws; a socket not found leaves its rank unnamed. */
  void Find(gloo::rendezvous::Store &store, int rank, int size);

  /* "peer rank R: " when what names one peer's address (not as the prefix
   * of a longer port), "" otherwise. */
  std::string RankIn(const std::string &what) const;

  /* The ranks whose connection the peer closed (it died or freed its
   * communicator), lowest first. */
  std::vector<int> Gone() const;

 private:
  std::vector<std::string> names_;  // by rank, as Gloo's errors write the address; "" unknown
  std::vector<int> fds_;            // by rank, a duplicate of the pair's socket; -1 unknown
};

}  // namespace pe_net

#endif
