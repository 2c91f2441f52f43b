// examples/forge-run.cpp - ./forge-run: starts N local ranks of a data-parallel program.
//
//   ./forge-run -n 2 ./finetune -m qwen2.5-0.5b --data chat.jsonl
//
// Each rank is the program with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: --port or a free port) and
// NCCL_NVLS_ENABLE=0 unless the environment sets it. SIGINT and SIGTERM are forwarded to every
// rank. When a rank exits with a non-zero status or is killed by a signal, forge-run says so,
// gives the other ranks a few seconds to stop by themselves (their watchdog names the failed
// rank), then sends SIGTERM, and SIGKILL 10 s later. Exit status: the first failure's (128 + the
// signal for a killed rank), else 0.
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

volatile sig_atomic_t g_signal = 0;
void on_signal(int s) { g_signal = s; }

[[noreturn]] void usage(const char *why) {
    std::fprintf(stderr,
                 "forge-run: %s\n"
                 "usage: forge-run -n N [--port P] PROGRAM [ARGS...]\n"
                 "  starts N ranks of PROGRAM on this host (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set\n"
                 "  as torchrun does); --port: rank 0's rendezvous port (default: a free one)\n",
                 why);
    std::exit(2);
}

int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET, a.sin_addr.s_addr = htonl(INADDR_LOOPBACK), a.sin_port = 0;
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (sockaddr *)&a, &len) != 0) {
        std::fprintf(stderr, "forge-run: cannot find a free port: %s (pass --port)\n", std::strerror(errno));
        std::exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

int parse_int(const char *opt, const char *s, int lo, int hi) {
    char *end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) usage((std::string(opt) + ": '" + s + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]").c_str());
    return (int)v;
}

} // namespace

int main(int argc, char **argv) {
    int n = 0, port = 0, i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") usage("starts the ranks of a data-parallel run");
        if (i + 1 >= argc) usage((a + " needs a value").c_str());
        if (a == "-n") n = parse_int("-n", argv[++i], 1, 4096);
        else if (a == "--port") port = parse_int("--port", argv[++i], 1, 65535);
        else usage(("unknown option '" + a + "'").c_str());
    }
    if (n == 0) usage("-n N (the number of ranks) is required");
    if (i >= argc) usage("no PROGRAM to run");
    if (!port) port = free_port();

    struct sigaction sa {};
    sa.sa_handler = on_signal; // no SA_RESTART: a signal interrupts the sleep below
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    std::vector<pid_t> pids((size_t)n, 0);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            std::fprintf(stderr, "forge-run: fork: %s\n", std::strerror(errno));
            for (int k = 0; k < r; k++) kill(pids[(size_t)k], SIGTERM);
            return 1;
        }
        if (pid == 0) {
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            setenv("RANK", std::to_string(r).c_str(), 1);
            setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
            setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
            setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
            setenv("NCCL_NVLS_ENABLE", "0", 0);
            execvp(argv[i], argv + i);
            std::fprintf(stderr, "forge-run: rank %d: cannot run %s: %s\n", r, argv[i], std::strerror(errno));
            _exit(127);
        }
        pids[(size_t)r] = pid;
    }

    using Clock = std::chrono::steady_clock;
    int live = n, status = 0, forwarded = 0;
    bool failed = false, termed = false, killed = false;
    Clock::time_point failed_at;
    while (live > 0) {
        int st = 0;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            int r = 0;
            while (r < n && pids[(size_t)r] != pid) r++;
            if (r == n) continue;
            pids[(size_t)r] = 0;
            live--;
            const bool bad = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
            if (!bad) continue;
            if (WIFSIGNALED(st))
                std::fprintf(stderr, "forge-run: rank %d was killed by signal %d (%s)\n", r, WTERMSIG(st), strsignal(WTERMSIG(st)));
            else
                std::fprintf(stderr, "forge-run: rank %d exited with status %d\n", r, WEXITSTATUS(st));
            if (!failed) {
                failed = true;
                failed_at = Clock::now();
                status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
            }
            continue;
        }
        if (g_signal && g_signal != forwarded) { // forward SIGINT / SIGTERM once each
            forwarded = g_signal;
            for (pid_t p : pids)
                if (p) kill(p, forwarded);
        }
        if (failed && live > 0) {
            const double s = std::chrono::duration<double>(Clock::now() - failed_at).count();
            const int sig = !termed && s > 5 ? SIGTERM : !killed && s > 15 ? SIGKILL : 0;
            if (sig) {
                std::fprintf(stderr, "forge-run: sending %s to the %d rank(s) still running\n", sig == SIGTERM ? "SIGTERM" : "SIGKILL", live);
                for (pid_t p : pids)
                    if (p) kill(p, sig);
                (sig == SIGTERM ? termed : killed) = true;
            }
        }
        usleep(50 * 1000);
    }
    return status;
}
