/* The rendezvous store over TCP (tcp_store.h).
 *
 * Wire format: frames of a 4-byte big-endian length and a payload; a payload
 * is one op byte and fields, each a 4-byte big-endian length and its bytes
 * (numbers are fields of 4 bytes).
 *   'H' job token world rank  -> 'K' | 'E' reason   (first frame only)
 *   'S' key value             -> 'K' | 'E' reason
 *   'G' key timeout_ms        -> 'V' value | 'M' (not there in time) | 'E' reason */
#include "net/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace pe_net {
namespace {

constexpr uint32_t kMaxFrame = 64u << 20;  // addresses are bytes; anything larger is garbage

std::string Errno(int err) {
  return std::string(strerror(err));
}

class Frame {
 public:
  explicit Frame(char op) { buf_.push_back(op); }
  Frame &Put(const void *p, size_t n) {
    PutLen(static_cast<uint32_t>(n));
    buf_.append(static_cast<const char *>(p), n);
    return *this;
  }
  Frame &Put(const std::string &s) { return Put(s.data(), s.size()); }
  Frame &Put(uint32_t v) {
    uint32_t be = htonl(v);
    return Put(&be, sizeof be);
  }
  const std::string &Bytes() const { return buf_; }

 private:
  void PutLen(uint32_t n) {
    uint32_t be = htonl(n);
    buf_.append(reinterpret_cast<const char *>(&be), sizeof be);
  }
  std::string buf_;
};

/* Reads the fields of a received payload; throws on a short one. */
class Fields {
 public:
  explicit Fields(const std::vector<char> &p) : p_(p) {}
  char Op() {
    if (p_.empty()) throw std::runtime_error("rendezvous: empty message");
    pos_ = 1;
    return p_[0];
  }
  std::string Str() {
    uint32_t n = Len();
    std::string s(p_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  std::vector<char> Bytes() {
    uint32_t n = Len();
    std::vector<char> v(p_.begin() + pos_, p_.begin() + pos_ + n);
    pos_ += n;
    return v;
  }
  uint32_t U32() {
    std::string s = Str();
    if (s.size() != 4) throw std::runtime_error("rendezvous: malformed number field");
    uint32_t be;
    memcpy(&be, s.data(), 4);
    return ntohl(be);
  }

 private:
  uint32_t Len() {
    uint32_t be;
    if (p_.size() - pos_ < 4) throw std::runtime_error("rendezvous: truncated message");
    memcpy(&be, p_.data() + pos_, 4);
    pos_ += 4;
    uint32_t n = ntohl(be);
    if (p_.size() - pos_ < n) throw std::runtime_error("rendezvous: truncated message");
    return n;
  }
  const std::vector<char> &p_;
  size_t pos_ = 0;
};

/* false on EOF or error (errno says which; 0 for EOF). */
bool SendAll(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool RecvAll(int fd, char *p, size_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = 0;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendFrame(int fd, const Frame &f) {
  const std::string &b = f.Bytes();
  uint32_t be = htonl(static_cast<uint32_t>(b.size()));
  return SendAll(fd, reinterpret_cast<const char *>(&be), sizeof be) &&
         SendAll(fd, b.data(), b.size());
}

bool RecvFrame(int fd, std::vector<char> *out) {
  uint32_t be;
  if (!RecvAll(fd, reinterpret_cast<char *>(&be), sizeof be)) return false;
  uint32_t n = ntohl(be);
  if (n == 0 || n > kMaxFrame) {
    errno = EPROTO;
    return false;
  }
  out->resize(n);
  return RecvAll(fd, out->data(), n);
}

struct AddrInfo {
  addrinfo *list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

void Resolve(const std::string &host, int port, bool passive, AddrInfo *ai) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &ai->list);
  if (rc != 0)
    throw std::runtime_error("rendezvous address " + host + ":" + service +
                             " does not resolve: " + gai_strerror(rc));
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr *>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return std::string(host) + ":" + serv;
}

void SetTimeouts(int fd, std::chrono::milliseconds recv_ms, std::chrono::milliseconds send_ms) {
  auto tv = [](std::chrono::milliseconds ms) {
    timeval t{};
    t.tv_sec = static_cast<time_t>(ms.count() / 1000);
    t.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
    return t;
  };
  timeval r = tv(recv_ms), s = tv(send_ms);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &r, sizeof r);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &s, sizeof s);
}

/* Same length and same bytes, in time that does not depend on where they differ. */
bool SameSecret(const std::string &a, const std::string &b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; i++) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

/* ---- server ---- */

StoreServer::StoreServer(const std::string &host, int port, const StoreHello &self)
    : self_(self), joined_(static_cast<size_t>(self.world_size), false) {
  AddrInfo ai;
  Resolve(host, port, true, &ai);
  int err = 0;
  for (addrinfo *a = ai.list; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      listen_fd_ = fd;
      break;
    }
    err = errno;
    close(fd);
  }
  if (listen_fd_ < 0)
    throw std::runtime_error("cannot listen on rendezvous " + host + ":" + std::to_string(port) +
                             ": " + Errno(err));
  acceptor_ = std::thread(&StoreServer::AcceptLoop, this);
}

StoreServer::~StoreServer() {
  Stop();
}

void StoreServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    // shutdown wakes the thread blocked in accept and those in recv; the
    // write side stays open so that a woken GET still sends its answer.
    shutdown(listen_fd_, SHUT_RDWR);
  }
  changed_.notify_all();
  acceptor_.join();  // no connection is added after this
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conns_) shutdown(fd, SHUT_RD);
  }
  for (std::thread &t : threads_) t.join();
  for (int fd : conns_) close(fd);
  close(listen_fd_);
}

void StoreServer::AcceptLoop() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // Stop() shut the socket down
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    conns_.push_back(fd);
    threads_.emplace_back(&StoreServer::Serve, this, fd, PeerName(fd));
  }
}

void StoreServer::MarkFormed() {
  std::lock_guard<std::mutex> lock(mu_);
  formed_ = true;
  data_.clear();  // the pair addresses are read: nobody needs them again
}

void StoreServer::Fail(const std::string &reason) {
  if (failure_.empty()) failure_ = reason;
  changed_.notify_all();
}

/* Empty when h may join; the reason otherwise. Called with mu_ held. */
std::string StoreServer::Admit(const StoreHello &h, const std::string &from) {
  std::string who = "rank " + std::to_string(h.rank) + " (from " + from + ")";
  if (h.job != self_.job) return who + " belongs to job '" + h.job + "', not '" + self_.job + "'";
  if (!SameSecret(h.token, self_.token))
    return who + " presented a token that differs from rank 0's";
  if (h.world_size != self_.world_size)
    return who + " expects world size " + std::to_string(h.world_size) + ", rank 0 expects " +
           std::to_string(self_.world_size);
  if (h.rank < 0 || h.rank >= self_.world_size)
    return who + " is out of range for world size " + std::to_string(self_.world_size);
  if (formed_)
    return who + " joined twice: job '" + self_.job + "' formed already with its " +
           std::to_string(self_.world_size) +
           " nodes (a node that comes after the job formed is refused; when a node of the job "
           "is lost, the others notice at their next step, and the job forms again when every "
           "node registers)";
  if (joined_[static_cast<size_t>(h.rank)]) return who + " joined twice";
  joined_[static_cast<size_t>(h.rank)] = true;
  return "";
}

void StoreServer::Serve(int fd, std::string from) {
  std::vector<char> msg;
  bool admitted = false;
  try {
    while (RecvFrame(fd, &msg)) {
      Fields in(msg);
      char op = in.Op();
      std::unique_lock<std::mutex> lock(mu_);
      if (!admitted) {
        std::string why = "the first message is not a HELLO";
        if (op == 'H') {
          StoreHello h;
          h.job = in.Str();
          h.token = in.Str();
          h.world_size = static_cast<int>(in.U32());
          h.rank = static_cast<int>(in.U32());
          why = Admit(h, from);
        }
        if (!why.empty()) {
          if (!formed_) Fail(why);
          lock.unlock();
          SendFrame(fd, Frame('E').Put(why));
          return;
        }
        admitted = true;
        lock.unlock();
        if (!SendFrame(fd, Frame('K'))) return;
        continue;
      }
      if (!failure_.empty()) {
        std::string why = failure_;
        lock.unlock();
        if (!SendFrame(fd, Frame('E').Put(why))) return;
        continue;
      }
      if (op == 'S') {
        std::string key = in.Str();
        data_[key] = in.Bytes();
        changed_.notify_all();
        lock.unlock();
        if (!SendFrame(fd, Frame('K'))) return;
      } else if (op == 'G') {
        std::string key = in.Str();
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(in.U32());
        changed_.wait_until(lock, deadline,
                            [&] { return stopping_ || !failure_.empty() || data_.count(key); });
        Frame reply('M');
        if (!failure_.empty())
          reply = Frame('E').Put(failure_);
        else if (data_.count(key))
          reply = Frame('V').Put(data_[key].data(), data_[key].size());
        else if (stopping_)
          reply = Frame('E').Put(std::string("rank 0 left the rendezvous"));
        lock.unlock();
        if (!SendFrame(fd, reply)) return;
      } else {
        lock.unlock();
        SendFrame(fd, Frame('E').Put("rendezvous: unknown request"));
        return;
      }
    }
  } catch (const std::exception &e) {
    SendFrame(fd, Frame('E').Put(std::string(e.what())));
  }
}

/* ---- client ---- */

StoreClient::StoreClient(const std::string &host, int port, const StoreHello &self,
                         std::chrono::milliseconds timeout)
    : where_(host + ":" + std::to_string(port)), timeout_(timeout) {
  // Rank 0 may start after the others: retry until the timeout.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int err = 0;
  for (;;) {
    AddrInfo ai;
    Resolve(host, port, false, &ai);
    for (addrinfo *a = ai.list; a && fd_ < 0; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        err = errno;
        continue;
      }
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
        break;
      }
      err = errno;
      close(fd);
    }
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("rank 0's rendezvous " + where_ + " is unreachable after " +
                               std::to_string(timeout.count()) + " ms: " + Errno(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // The server answers a GET by its timeout; a silent server is a dead one.
  SetTimeouts(fd_, timeout + std::chrono::seconds(2), timeout);
  std::vector<char> reply;
  Frame hello('H');
  hello.Put(self.job).Put(self.token);
  hello.Put(static_cast<uint32_t>(self.world_size)).Put(static_cast<uint32_t>(self.rank));
  if (!SendFrame(fd_, hello) || !RecvFrame(fd_, &reply)) {
    int e = errno;
    close(fd_);
    throw std::runtime_error("rank 0's rendezvous " + where_ +
                             " dropped the connection: " + (e ? Errno(e) : std::string("closed")));
  }
  Fields in(reply);
  if (in.Op() != 'K') {
    std::string why = in.Str();
    close(fd_);
    throw StoreRefused("rank 0's rendezvous " + where_ + " refused this rank: " + why);
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

void StoreClient::set(const std::string &key, const std::vector<char> &data) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<char> reply;
  if (!SendFrame(fd_, Frame('S').Put(key).Put(data.data(), data.size())) || !RecvFrame(fd_, &reply))
    throw std::runtime_error("rank 0's rendezvous " + where_ + " is gone (setting '" + key +
                             "'): " + (errno ? Errno(errno) : std::string("closed")));
  Fields in(reply);
  if (in.Op() != 'K') throw StoreRefused("rendezvous failed: " + in.Str());
}

std::vector<char> StoreClient::Get(const std::string &key, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<char> reply;
  SetTimeouts(fd_, timeout + std::chrono::seconds(2), timeout_);
  if (!SendFrame(fd_, Frame('G').Put(key).Put(static_cast<uint32_t>(timeout.count()))) ||
      !RecvFrame(fd_, &reply))
    throw std::runtime_error("rank 0's rendezvous " + where_ + " is gone (waiting for '" + key +
                             "'): " + (errno ? Errno(errno) : std::string("closed")));
  Fields in(reply);
  switch (in.Op()) {
    case 'V': return in.Bytes();
    case 'M':
      throw std::runtime_error("rendezvous timed out after " + std::to_string(timeout.count()) +
                               " ms waiting for '" + key + "' (a rank has not joined)");
    default: throw StoreRefused("rendezvous failed: " + in.Str());
  }
}

std::vector<char> StoreClient::get(const std::string &key) {
  return Get(key, timeout_);
}

void StoreClient::wait(const std::vector<std::string> &keys) {
  wait(keys, timeout_);
}

void StoreClient::wait(const std::vector<std::string> &keys,
                       const std::chrono::milliseconds &timeout) {
  for (const std::string &k : keys) Get(k, timeout);
}

}  // namespace pe_net
