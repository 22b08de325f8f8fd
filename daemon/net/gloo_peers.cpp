/* Mapping Gloo's pair sockets to ranks (gloo_peers.h). */
#include "net/gloo_peers.h"

#include <dirent.h>
#include <fcntl.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace pe_net {
namespace {

bool SameEndpoint(const sockaddr_storage &a, const sockaddr_storage &b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto &x = reinterpret_cast<const sockaddr_in &>(a);
    auto &y = reinterpret_cast<const sockaddr_in &>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    auto &x = reinterpret_cast<const sockaddr_in6 &>(a);
    auto &y = reinterpret_cast<const sockaddr_in6 &>(b);
    return x.sin6_port == y.sin6_port &&
           memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

struct Conn {
  int fd;
  sockaddr_storage self, peer;
};

/* This process's connected stream sockets. */
std::vector<Conn> ConnectedSockets() {
  std::vector<Conn> out;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return out;
  int dfd = dirfd(d);
  while (dirent *e = readdir(d)) {
    if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    int fd = atoi(e->d_name);
    int type = 0;
    socklen_t tl = sizeof type;
    if (fd == dfd || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
      continue;
    Conn c{};
    c.fd = fd;
    socklen_t sl = sizeof c.self, pl = sizeof c.peer;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&c.self), &sl) == 0 &&
        getpeername(fd, reinterpret_cast<sockaddr *>(&c.peer), &pl) == 0)
      out.push_back(c);
  }
  closedir(d);
  return out;
}

}  // namespace

PeerLinks::~PeerLinks() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

void PeerLinks::Find(gloo::rendezvous::Store &store, int rank, int size) {
  names_.assign(static_cast<size_t>(size), "");
  fds_.assign(static_cast<size_t>(size), -1);
  if (size < 2) return;
  // Where rank i's pair with rank j listens: rank i's store entry (key
  // "i", written by connectFullMesh) lists its pairs' addresses in rank
  // order, itself left out.
  auto listens_at = [&](int i, int j) {
    std::vector<char> all = store.get(std::to_string(i));
    size_t each = all.size() / static_cast<size_t>(size - 1);
    size_t at = static_cast<size_t>(j < i ? j : j - 1) * each;
    std::vector<char> bytes(all.begin() + at, all.begin() + at + each);
    return gloo::transport::tcp::Address(bytes).getSockaddr();
  };
  std::vector<sockaddr_storage> mine(static_cast<size_t>(size)), theirs(static_cast<size_t>(size));
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    mine[j] = listens_at(rank, j);
    theirs[j] = listens_at(j, rank);
  }
  std::vector<Conn> conns = ConnectedSockets();
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    for (const Conn &c : conns)
      if (SameEndpoint(c.peer, theirs[j]) || SameEndpoint(c.self, mine[j])) {
        names_[j] = gloo::transport::tcp::Address(c.peer).str();
        fds_[j] = fcntl(c.fd, F_DUPFD_CLOEXEC, 0);
        break;
      }
  }
}

std::string PeerLinks::RankIn(const std::string &what) const {
  for (size_t r = 0; r < names_.size(); r++) {
    const std::string &a = names_[r];
    if (a.empty()) continue;
    for (size_t at = what.find(a); at != std::string::npos; at = what.find(a, at + 1)) {
      size_t end = at + a.size();
      if (end == what.size() || !isdigit(static_cast<unsigned char>(what[end])))
        return "peer rank " + std::to_string(r) + ": ";
    }
  }
  return "";
}

std::vector<int> PeerLinks::Gone() const {
  std::vector<int> gone;
  for (size_t r = 0; r < fds_.size(); r++) {
    if (fds_[r] < 0) continue;
    pollfd p = {fds_[r], POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
      gone.push_back(static_cast<int>(r));
  }
  return gone;
}

}  // namespace pe_net
