// models/dist.h - how the ranks of a data-parallel run find each other and learn of each other's
// failures, without MPI: the launcher's environment, a TCP rendezvous that hands every rank the
// NCCL communicator's id, and a watchdog on the same sockets.
//
// Rendezvous: rank 0 listens on MASTER_PORT; every other rank connects to MASTER_ADDR:MASTER_PORT
// (retrying until a deadline), says "HELLO <rank> <world>", and rank 0, once all are there and
// consistent, sends each "ID <hex>". The sockets then stay open as a star of liveness channels.
// A rank that fails sends "FAIL <rank> <message>" (to rank 0, or from rank 0 to all); a rank that
// finishes sends "DONE <rank>". Rank 0 relays a failure ("FAIL", or "LOST <rank>" when a socket
// closes without DONE: the process was killed or crashed) to every other rank. Each rank's
// watchdog thread polls its sockets and calls back with a sentence naming the rank; ./finetune
// then aborts the NCCL communicator (a step blocked in a collective returns) and exits.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace forge {

struct DistEnv {
    int rank = 0, world = 1, local_rank = 0;
    std::string addr;     // MASTER_ADDR: where rank 0 listens
    int port = 0;         // MASTER_PORT
    std::string launcher; // "torchrun" (also forge-run), "slurm", "mpirun", or "" (one process)
};

// Looks an environment variable up (NULL when unset); the default reads the process's environment.
using EnvLookup = std::function<const char *(const char *)>;

// Reads the launcher's variables, in this order:
//   torchrun / forge-run: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
//   Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, with MASTER_ADDR and MASTER_PORT;
//   Open MPI's mpirun: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, MASTER_ADDR
//     (default 127.0.0.1 when every rank is on this host) and MASTER_PORT (default 29500);
//   none of them: one process (world 1).
// A missing, malformed or inconsistent value is an error naming the variable.
bool dist_env_read(DistEnv *out, std::string *err, const EnvLookup &env = nullptr);

// One rank's end of the rendezvous and of the liveness channels.
class DistLink {
public:
    // Called by the watchdog thread with "rank 2 failed: <its message>" or "lost contact with
    // rank 1 (...)"; the watchdog stops after it.
    using FailFn = std::function<void(const std::string &what)>;

    DistLink() = default;
    DistLink(const DistLink &) = delete;
    DistLink &operator=(const DistLink &) = delete;
    ~DistLink(); // stops the watchdog and closes the sockets (a peer sees "lost contact" unless done() ran)

    // Rank 0: listens on port (0: a free port, then port() says which). join() does it when needed.
    bool listen(int port, std::string *err);
    int port() const { return port_; }
    // Joins the group described by env: rank 0 waits for the others and sends them *id; the others
    // connect (retrying for timeout_s) and receive it into *id. Errors name the rank, the address
    // and the variable to check.
    bool join(const DistEnv &env, std::string *id, double timeout_s, std::string *err);
    // Starts the watchdog thread.
    void watch(FailFn on_failure);
    // This rank failed: tells the others (best effort), then stops watching. Call before exiting.
    void fail(const std::string &message);
    // This rank finished: tells the others that its sockets will close, then stops watching.
    // After either call, both are no-ops.
    void done();

private:
    struct Peer {
        int fd = -1, rank = -1;
        std::string buf; // bytes received after the last complete line
        bool done = false;
    };
    void send_line(Peer &p, const std::string &line);
    void broadcast(const std::string &line, int except_rank);
    void stop();
    void loop(FailFn on_failure);
    // Handles one line from p; returns a failure sentence, or "" to go on.
    std::string handle(Peer &p, const std::string &line);

    int rank_ = 0, world_ = 1, port_ = 0, listen_fd_ = -1, wake_[2] = {-1, -1};
    std::vector<Peer> peers_; // rank 0: every other rank; others: rank 0
    std::mutex send_mu_;
    std::atomic<bool> stopping_{false};
    bool finished_ = false; // fail() or done() ran: say nothing more
    std::thread thread_;
};

} // namespace forge
