// models/dist.cpp - the launcher's environment, the TCP rendezvous and the watchdog of a
// data-parallel run (see dist.h for the protocol). Plain POSIX sockets; one line per message.
#include "dist.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace forge {

// ---- the environment -------------------------------------------------------------------------

bool dist_env_read(DistEnv *out, std::string *err, const EnvLookup &env) {
    auto get = [&](const char *k) -> const char * {
        const char *v = env ? env(k) : std::getenv(k);
        return v && *v ? v : nullptr;
    };
    auto fail = [&](const std::string &m) {
        *err = m;
        return false;
    };
    // an integer variable in [lo, hi]
    auto num = [&](const char *k, long lo, long hi, int *v) {
        const char *s = get(k);
        if (!s) return fail(std::string(k) + " is not set");
        char *end = nullptr;
        errno = 0;
        long x = std::strtol(s, &end, 10);
        if (*end || errno || x < lo || x > hi)
            return fail("the environment variable " + std::string(k) + "=" + s + " is not an integer in [" + std::to_string(lo) + ", " +
                        std::to_string(hi) + "]");
        *v = (int)x;
        return true;
    };
    DistEnv e;
    const char *rank_var, *world_var, *local_var;
    if (get("RANK") || get("WORLD_SIZE")) {
        e.launcher = "torchrun", rank_var = "RANK", world_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
    } else if (get("SLURM_PROCID") && get("SLURM_NTASKS")) {
        e.launcher = "slurm", rank_var = "SLURM_PROCID", world_var = "SLURM_NTASKS", local_var = "SLURM_LOCALID";
    } else if (get("OMPI_COMM_WORLD_RANK") || get("OMPI_COMM_WORLD_SIZE")) {
        e.launcher = "mpirun", rank_var = "OMPI_COMM_WORLD_RANK", world_var = "OMPI_COMM_WORLD_SIZE", local_var = "OMPI_COMM_WORLD_LOCAL_RANK";
    } else {
        *out = e;
        return true;
    }
    if (!num(world_var, 1, 1 << 20, &e.world)) return false;
    if (!num(rank_var, 0, 1 << 20, &e.rank)) return false;
    if (e.rank >= e.world)
        return fail(std::string(rank_var) + "=" + std::to_string(e.rank) + " must be below " + world_var + "=" + std::to_string(e.world));
    if (e.world == 1) {
        *out = e;
        return true;
    }
    if (!num(local_var, 0, 1 << 20, &e.local_rank)) return false;
    const char *addr = get("MASTER_ADDR");
    if (!addr && e.launcher == "mpirun") { // one host: every rank is local
        int local_size = 0;
        if (!num("OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1 << 20, &local_size)) return false;
        if (local_size != e.world)
            return fail("MASTER_ADDR is not set and the " + std::to_string(e.world) + " ranks span several hosts (OMPI_COMM_WORLD_LOCAL_SIZE=" +
                        std::to_string(local_size) + "): export MASTER_ADDR=<rank 0's host> (mpirun -x MASTER_ADDR)");
        addr = "127.0.0.1";
    }
    if (!addr)
        return fail("MASTER_ADDR is not set: the " + std::to_string(e.world) + " ranks (" + world_var + ") need rank 0's address" +
                    (e.launcher == "slurm" ? " (in the batch script: export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1))" : ""));
    e.addr = addr;
    if (!get("MASTER_PORT") && e.launcher == "mpirun") e.port = 29500;
    else if (!get("MASTER_PORT")) return fail("MASTER_PORT is not set: the ranks need a TCP port on which rank 0 listens (export MASTER_PORT=29500)");
    else if (!num("MASTER_PORT", 1, 65535, &e.port)) return false;
    *out = e;
    return true;
}

// ---- sockets ---------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) { return std::chrono::duration<double>(deadline - Clock::now()).count(); }

int poll_ms(Clock::time_point deadline) {
    double s = seconds_left(deadline);
    return s <= 0 ? 0 : (int)std::min(s * 1000 + 1, 1000.0);
}

// Reads from fd until buf holds a complete line (returned without '\n') or the deadline passes.
// false: EOF, an error or the deadline; *why says which.
bool read_line(int fd, std::string *buf, std::string *line, Clock::time_point deadline, std::string *why) {
    for (;;) {
        size_t nl = buf->find('\n');
        if (nl != std::string::npos) {
            *line = buf->substr(0, nl);
            buf->erase(0, nl + 1);
            return true;
        }
        if (seconds_left(deadline) <= 0) return (*why = "timed out"), false;
        pollfd p{fd, POLLIN, 0};
        int r = poll(&p, 1, poll_ms(deadline));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return (*why = n == 0 ? "the connection was closed" : std::strerror(errno)), false;
        buf->append(tmp, (size_t)n);
    }
}

bool send_all(int fd, const std::string &s) {
    size_t off = 0;
    while (off < s.size()) {
        ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += (size_t)n;
    }
    return true;
}

std::string to_hex(const std::string &s) {
    static const char *d = "0123456789abcdef";
    std::string h;
    for (unsigned char c : s) h += d[c >> 4], h += d[c & 15];
    return h;
}

bool from_hex(const std::string &h, std::string *out) {
    if (h.size() % 2) return false;
    out->clear();
    for (size_t i = 0; i < h.size(); i += 2) {
        int v = 0;
        for (char c : {h[i], h[i + 1]}) {
            int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (x < 0) return false;
            v = v * 16 + x;
        }
        out->push_back((char)v);
    }
    return true;
}

// "FAIL 3 text" -> {"FAIL", 3, "text"}
struct Msg {
    std::string kind;
    int rank = -1;
    std::string text;
};
Msg parse(const std::string &line) {
    Msg m;
    size_t a = line.find(' ');
    m.kind = line.substr(0, a);
    if (a == std::string::npos) return m;
    size_t b = line.find(' ', a + 1);
    m.rank = std::atoi(line.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1).c_str());
    if (b != std::string::npos) m.text = line.substr(b + 1);
    return m;
}

std::string one_line(std::string s) {
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
}

} // namespace

DistLink::~DistLink() {
    stop();
    for (Peer &p : peers_)
        if (p.fd >= 0) close(p.fd);
    if (listen_fd_ >= 0) close(listen_fd_);
}

bool DistLink::listen(int port, std::string *err) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    bool v6 = fd >= 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return (*err = std::string("rank 0: socket: ") + std::strerror(errno)), false;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int r;
    if (v6) { // both IPv6 and IPv4 peers
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        sockaddr_in6 a{};
        a.sin6_family = AF_INET6, a.sin6_addr = in6addr_any, a.sin6_port = htons((uint16_t)port);
        r = bind(fd, (sockaddr *)&a, sizeof a);
    } else {
        sockaddr_in a{};
        a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_ANY), a.sin_port = htons((uint16_t)port);
        r = bind(fd, (sockaddr *)&a, sizeof a);
    }
    if (r != 0 || ::listen(fd, 128) != 0) {
        *err = "rank 0: cannot listen on port " + std::to_string(port) + " (MASTER_PORT): " + std::strerror(errno);
        close(fd);
        return false;
    }
    sockaddr_storage got{};
    socklen_t len = sizeof got;
    getsockname(fd, (sockaddr *)&got, &len);
    port_ = ntohs(got.ss_family == AF_INET6 ? ((sockaddr_in6 *)&got)->sin6_port : ((sockaddr_in *)&got)->sin_port);
    listen_fd_ = fd;
    return true;
}

bool DistLink::join(const DistEnv &env, std::string *id, double timeout_s, std::string *err) {
    rank_ = env.rank, world_ = env.world;
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    const std::string me = "rank " + std::to_string(rank_);
    if (world_ == 1) return true;
    if (rank_ == 0) {
        if (listen_fd_ < 0 && !listen(env.port, err)) return false;
        std::vector<bool> seen((size_t)world_, false);
        int joined = 0;
        auto reject = [&](int fd, const std::string &why) {
            send_all(fd, "FAIL 0 " + one_line(why) + "\n");
            close(fd);
            *err = "rank 0: " + why;
            return false;
        };
        while (joined < world_ - 1) {
            if (seconds_left(deadline) <= 0) {
                std::string missing;
                for (int k = 1; k < world_; k++)
                    if (!seen[(size_t)k]) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
                *err = "rank 0: waited " + std::to_string((int)timeout_s) + " s on port " + std::to_string(port_) + " (MASTER_PORT) for rank(s) " +
                       missing + " to connect; did they start, with the same MASTER_ADDR and MASTER_PORT?";
                return false;
            }
            pollfd p{listen_fd_, POLLIN, 0};
            if (poll(&p, 1, poll_ms(deadline)) <= 0) continue;
            int fd = accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) continue;
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            std::string buf, line, why;
            if (!read_line(fd, &buf, &line, std::min(deadline, Clock::now() + std::chrono::seconds(10)), &why)) {
                close(fd); // not a rank (a port scanner, or a rank that died): keep waiting
                continue;
            }
            Msg m = parse(line);
            int w = std::atoi(m.text.c_str());
            if (m.kind != "HELLO") return reject(fd, "a process connected to port " + std::to_string(port_) + " without saying which rank it is");
            if (w != world_)
                return reject(fd, "rank " + std::to_string(m.rank) + " was started with a world size of " + std::to_string(w) + ", rank 0 with " +
                                      std::to_string(world_) + " (WORLD_SIZE must be the same on every rank)");
            if (m.rank < 1 || m.rank >= world_ || seen[(size_t)m.rank])
                return reject(fd, "a second process connected as rank " + std::to_string(m.rank) + " (each RANK must be unique, 0.." +
                                      std::to_string(world_ - 1) + ")");
            seen[(size_t)m.rank] = true;
            joined++;
            Peer peer;
            peer.fd = fd, peer.rank = m.rank, peer.buf = buf;
            peers_.push_back(peer);
        }
        close(listen_fd_);
        listen_fd_ = -1;
        std::sort(peers_.begin(), peers_.end(), [](const Peer &a, const Peer &b) { return a.rank < b.rank; });
        broadcast("ID " + to_hex(*id) + "\n", -1);
        return true;
    }
    // other ranks: connect to rank 0, retrying while it starts
    std::string why = "no attempt", port = std::to_string(env.port);
    int fd = -1;
    while (fd < 0) {
        addrinfo hints{}, *res = nullptr;
        hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(env.addr.c_str(), port.c_str(), &hints, &res);
        if (gai != 0) why = std::string("cannot resolve the address: ") + gai_strerror(gai);
        for (addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (s < 0) continue;
            if (connect(s, a->ai_addr, a->ai_addrlen) == 0) fd = s;
            else why = std::strerror(errno), close(s);
        }
        if (res) freeaddrinfo(res);
        if (fd >= 0) break;
        if (seconds_left(deadline) <= 0) {
            *err = me + ": could not connect to rank 0 at MASTER_ADDR=" + env.addr + " MASTER_PORT=" + port + " within " +
                   std::to_string((int)timeout_s) + " s (" + why + "); is rank 0 running?";
            return false;
        }
        usleep(100 * 1000);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Peer peer;
    peer.fd = fd, peer.rank = 0;
    peers_.push_back(peer);
    std::string line;
    if (!send_all(fd, "HELLO " + std::to_string(rank_) + " " + std::to_string(world_) + "\n") ||
        !read_line(fd, &peers_[0].buf, &line, deadline, &why)) {
        *err = me + ": the rendezvous with rank 0 at " + env.addr + ":" + port + " failed: " + why;
        return false;
    }
    Msg m = parse(line);
    if (m.kind == "FAIL") return (*err = me + ": rank 0 rejected it: " + m.text), false;
    if (m.kind != "ID" || !from_hex(line.substr(3), id)) return (*err = me + ": rank 0 sent a malformed id: " + line.substr(0, 80)), false;
    return true;
}

void DistLink::send_line(Peer &p, const std::string &line) {
    std::lock_guard<std::mutex> lock(send_mu_); // the watchdog closes sockets and marks peers done under it
    if (p.fd >= 0 && !p.done) send_all(p.fd, line);
}

void DistLink::broadcast(const std::string &line, int except_rank) {
    for (Peer &p : peers_)
        if (p.rank != except_rank) send_line(p, line);
}

void DistLink::watch(FailFn on_failure) {
    if (peers_.empty() || thread_.joinable()) return;
    if (pipe(wake_) != 0) return;
    stopping_ = false;
    thread_ = std::thread([this, on_failure]() { loop(on_failure); });
}

std::string DistLink::handle(Peer &p, const std::string &line) {
    Msg m = parse(line);
    if (m.kind == "DONE") {
        std::lock_guard<std::mutex> lock(send_mu_);
        p.done = true;
        return "";
    }
    const std::string who = "rank " + std::to_string(m.rank);
    if (m.kind == "FAIL") {
        if (rank_ == 0) broadcast("FAIL " + std::to_string(m.rank) + " " + m.text + "\n", p.rank);
        return who + " failed: " + m.text;
    }
    if (m.kind == "LOST") return "rank 0 lost contact with " + who + " (it exited or was killed without a message)";
    return ""; // unknown lines are ignored: a newer peer may say more
}

void DistLink::loop(FailFn on_failure) {
    std::vector<pollfd> fds;
    for (;;) {
        fds.clear();
        fds.push_back({wake_[0], POLLIN, 0});
        for (const Peer &p : peers_) fds.push_back({p.fd, (short)(p.fd >= 0 ? POLLIN : 0), 0});
        int r = poll(fds.data(), fds.size(), -1);
        if (stopping_) return;
        if (r < 0) continue;
        std::string failure;
        for (size_t i = 0; i < peers_.size() && failure.empty(); i++) {
            Peer &p = peers_[i];
            if (p.fd < 0 || !(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char tmp[4096];
            ssize_t n = recv(p.fd, tmp, sizeof tmp, 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n > 0) {
                p.buf.append(tmp, (size_t)n);
                for (size_t nl; failure.empty() && (nl = p.buf.find('\n')) != std::string::npos;) {
                    std::string line = p.buf.substr(0, nl);
                    p.buf.erase(0, nl + 1);
                    failure = handle(p, line);
                }
                continue;
            }
            // closed: fine after DONE, a lost rank otherwise
            std::lock_guard<std::mutex> lock(send_mu_);
            close(p.fd);
            p.fd = -1;
            if (p.done) continue;
            failure = "lost contact with rank " + std::to_string(p.rank) + " (it exited or was killed without a message)";
            if (rank_ == 0)
                for (Peer &q : peers_)
                    if (q.fd >= 0 && !q.done) send_all(q.fd, "LOST " + std::to_string(p.rank) + "\n");
        }
        if (!failure.empty()) {
            if (!stopping_) on_failure(failure);
            return;
        }
        bool any = false;
        for (const Peer &p : peers_) any = any || p.fd >= 0;
        if (!any) return; // every peer finished
    }
}

void DistLink::stop() {
    if (!thread_.joinable()) return;
    stopping_ = true;
    if (write(wake_[1], "x", 1) < 0) {} // the thread wakes up and sees stopping_
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach(); // stop() from the callback
    else thread_.join();
    close(wake_[0]);
    close(wake_[1]);
    wake_[0] = wake_[1] = -1;
}

void DistLink::fail(const std::string &message) {
    if (world_ == 1 || finished_) return;
    finished_ = true;
    broadcast("FAIL " + std::to_string(rank_) + " " + one_line(message) + "\n", rank_);
    stop();
}

void DistLink::done() {
    if (world_ == 1 || finished_) return;
    finished_ = true;
    broadcast("DONE " + std::to_string(rank_) + "\n", rank_);
    stop();
}

} // namespace forge
