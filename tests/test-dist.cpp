// The single-process logic of data-parallel training, on the CPU: the launcher's environment
// (torchrun, Slurm, mpirun; errors naming the variable), the TCP rendezvous of several ranks (as
// threads on localhost, an ephemeral port) handing out the communicator id, the watchdog's
// failure relay (a rank's message, a rank that vanishes, rank 0's own failure, a clean finish),
// rejected and timed-out rendezvous, and forge_graph_build_allreduce on a small LoRA decoder:
// every gradient in exactly one bucket, placed after its last accumulation and before the end
// of the backward, extras in the last bucket, nothing added for one rank, the same training step
// with the collectives off, and an error naming the op when the CPU is asked to all-reduce.
#include "test-util.h"

#include "../forge-impl.h"
#include "../models/dist.h"
#include "../models/model.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

using namespace forge;

namespace {

bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// ---- the environment ----------------------------------------------------------------------------

bool read_env(const std::map<std::string, std::string> &vars, DistEnv *e, std::string *err) {
    return dist_env_read(e, err, [&](const char *k) -> const char * {
        auto it = vars.find(k);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
}

void test_env() {
    DistEnv e;
    std::string err;
    CHECK(read_env({}, &e, &err) && e.world == 1 && e.rank == 0 && e.launcher.empty(), "no launcher: one process");
    CHECK(read_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29501"}}, &e, &err) &&
              e.rank == 1 && e.world == 2 && e.local_rank == 1 && e.addr == "10.0.0.1" && e.port == 29501 && e.launcher == "torchrun",
          "torchrun: %s", err.c_str());
    CHECK(read_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}, &e, &err) && e.world == 1, "torchrun with one rank needs no address: %s", err.c_str());
    CHECK(read_env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "1234"}}, &e, &err) &&
              e.rank == 3 && e.world == 4 && e.local_rank == 1 && e.addr == "node7" && e.launcher == "slurm",
          "slurm: %s", err.c_str());
    CHECK(read_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}, &e, &err) &&
              e.rank == 1 && e.world == 2 && e.addr == "127.0.0.1" && e.port == 29500 && e.launcher == "mpirun",
          "mpirun on one host defaults the address and port: %s", err.c_str());
    // errors name the variable
    struct Bad {
        std::map<std::string, std::string> vars;
        const char *names;
    } bad[] = {
        {{{"RANK", "x1"}, {"WORLD_SIZE", "2"}}, "RANK=x1"},
        {{{"WORLD_SIZE", "2"}}, "RANK is not set"},
        {{{"RANK", "0"}}, "WORLD_SIZE is not set"},
        {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "must be below WORLD_SIZE=2"},
        {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}, "LOCAL_RANK is not set"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_PORT", "1"}}, "MASTER_ADDR is not set"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "a"}}, "MASTER_PORT is not set"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000"},
        {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"MASTER_PORT", "5"}}, "scontrol show hostnames"},
        {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
         "OMPI_COMM_WORLD_LOCAL_SIZE=2"},
    };
    for (const Bad &b : bad) {
        err.clear();
        CHECK(!read_env(b.vars, &e, &err) && has(err, b.names), "expected an error naming '%s', got '%s'", b.names, err.c_str());
    }
}

// ---- the rendezvous and the watchdog --------------------------------------------------------------

// What each rank's watchdog reported, with a wait for it.
struct Reports {
    std::mutex mu;
    std::condition_variable cv;
    std::map<int, std::string> by_rank;
    void add(int rank, const std::string &what) {
        std::lock_guard<std::mutex> lock(mu);
        by_rank[rank] = what;
        cv.notify_all();
    }
    // waits until `ranks` have reported (or 10 s); returns what they said
    std::map<int, std::string> wait(const std::vector<int> &ranks) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::seconds(10), [&]() {
            for (int r : ranks)
                if (!by_rank.count(r)) return false;
            return true;
        });
        return by_rank;
    }
};

DistEnv env_of(int rank, int world, int port) {
    DistEnv e;
    e.rank = rank, e.world = world, e.local_rank = rank, e.addr = "127.0.0.1", e.port = port, e.launcher = "test";
    return e;
}

// Starts `world` ranks as threads; every one joins and starts its watchdog reporting to *rep.
std::vector<std::unique_ptr<DistLink>> start_group(int world, Reports *rep, std::string *id_seen_by_last) {
    std::vector<std::unique_ptr<DistLink>> links;
    for (int r = 0; r < world; r++) links.emplace_back(new DistLink());
    std::string err;
    if (!links[0]->listen(0, &err)) {
        CHECK(false, "listen: %s", err.c_str());
        return {};
    }
    const int port = links[0]->port();
    std::string id(128, '\0');
    for (size_t i = 0; i < id.size(); i++) id[i] = (char)(i * 37 + 11);
    std::vector<std::string> ids((size_t)world), errs((size_t)world);
    std::vector<int> ok((size_t)world, 0);
    ids[0] = id;
    std::vector<std::thread> threads;
    for (int r = 0; r < world; r++)
        threads.emplace_back([&, r]() { ok[(size_t)r] = links[(size_t)r]->join(env_of(r, world, port), &ids[(size_t)r], 20, &errs[(size_t)r]); });
    for (auto &t : threads) t.join();
    for (int r = 0; r < world; r++) {
        CHECK(ok[(size_t)r], "rank %d join: %s", r, errs[(size_t)r].c_str());
        CHECK(ids[(size_t)r] == id, "rank %d received a different id (%zu bytes)", r, ids[(size_t)r].size());
        links[(size_t)r]->watch([rep, r](const std::string &what) { rep->add(r, what); });
    }
    if (id_seen_by_last) *id_seen_by_last = ids.back();
    return links;
}

void test_rendezvous() {
    { // a rank's failure reaches every other rank, relayed by rank 0
        Reports rep;
        auto links = start_group(3, &rep, nullptr);
        if (links.empty()) return;
        links[2]->fail("step 7: out of memory on cuda:2");
        auto got = rep.wait({0, 1});
        CHECK(got[0] == "rank 2 failed: step 7: out of memory on cuda:2", "rank 0 heard '%s'", got[0].c_str());
        CHECK(got[1] == "rank 2 failed: step 7: out of memory on cuda:2", "rank 1 heard '%s'", got[1].c_str());
        CHECK(!got.count(2), "the failing rank reported itself");
    }
    { // a rank that vanishes without a word (kill -9): rank 0 notices and tells the rest
        Reports rep;
        auto links = start_group(3, &rep, nullptr);
        if (links.empty()) return;
        auto t0 = std::chrono::steady_clock::now();
        links[1].reset();
        auto got = rep.wait({0, 2});
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(has(got[0], "lost contact with rank 1"), "rank 0 heard '%s'", got[0].c_str());
        CHECK(has(got[2], "rank 0 lost contact with rank 1"), "rank 2 heard '%s'", got[2].c_str());
        CHECK(s < 5, "noticing took %.1f s", s);
    }
    { // rank 0 fails: everyone hears it; rank 0 vanishing is noticed too
        Reports rep;
        auto links = start_group(3, &rep, nullptr);
        if (links.empty()) return;
        links[0]->fail("--out: disk full");
        auto got = rep.wait({1, 2});
        CHECK(got[1] == "rank 0 failed: --out: disk full" && got[2] == got[1], "ranks heard '%s' / '%s'", got[1].c_str(), got[2].c_str());
        Reports rep2;
        auto links2 = start_group(2, &rep2, nullptr);
        if (links2.empty()) return;
        links2[0].reset();
        auto got2 = rep2.wait({1});
        CHECK(has(got2[1], "lost contact with rank 0"), "rank 1 heard '%s'", got2[1].c_str());
    }
    { // a clean finish, in any order, reports nothing
        Reports rep;
        auto links = start_group(3, &rep, nullptr);
        if (links.empty()) return;
        links[2]->done();
        links[2].reset();
        links[0]->done();
        links[1]->done();
        links.clear();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        std::lock_guard<std::mutex> lock(rep.mu);
        CHECK(rep.by_rank.empty(), "a clean finish reported '%s'", rep.by_rank.empty() ? "" : rep.by_rank.begin()->second.c_str());
    }
    { // inconsistent world sizes are rejected on both sides, naming WORLD_SIZE
        DistLink r0, r1;
        std::string e0, e1, id0(128, 'x'), id1;
        CHECK(r0.listen(0, &e0), "listen: %s", e0.c_str());
        bool ok0 = true, ok1 = true;
        std::thread t([&]() { ok1 = r1.join(env_of(1, 3, r0.port()), &id1, 10, &e1); });
        ok0 = r0.join(env_of(0, 2, r0.port()), &id0, 10, &e0);
        t.join();
        CHECK(!ok0 && has(e0, "WORLD_SIZE"), "rank 0: '%s'", e0.c_str());
        CHECK(!ok1 && has(e1, "rank 0 rejected it") && has(e1, "WORLD_SIZE"), "rank 1: '%s'", e1.c_str());
    }
    { // nobody listening / nobody connecting: a timeout naming the address and the missing ranks
        std::string err, id;
        DistLink r0;
        CHECK(r0.listen(0, &err), "listen: %s", err.c_str());
        CHECK(!r0.join(env_of(0, 3, r0.port()), &id, 0.3, &err) && has(err, "rank(s) 1, 2"), "rank 0 timeout: '%s'", err.c_str());
        int closed_port = 0;
        {
            DistLink tmp;
            CHECK(tmp.listen(0, &err), "listen: %s", err.c_str());
            closed_port = tmp.port();
        } // closed: nobody listens there now
        DistLink lonely;
        CHECK(!lonely.join(env_of(1, 2, closed_port), &id, 0.5, &err) && has(err, "MASTER_ADDR=127.0.0.1") && has(err, "could not connect"),
              "rank 1 timeout: '%s'", err.c_str());
    }
}

// ---- forge_graph_build_allreduce ---------------------------------------------------------------

struct TrainGraph {
    Graph mg;
    forge_graph *g;
    forge_tensor *hyper, *adam, *prev = nullptr, *total = nullptr;
};

TrainGraph build_train(Model &m, forge_ctx *ctx, int world, size_t bucket) {
    TrainGraph t;
    std::string err;
    if (!model_build(m, 8, 2, FORGE_TYPE_F32, true, false, &t.mg, &err)) std::fprintf(stderr, "model_build: %s\n", err.c_str()), std::exit(2);
    t.g = forge_graph_new(ctx);
    CHECK(forge_graph_build_backward(t.g, t.mg.loss) == FORGE_OK, "backward: %s", forge_ctx_error(ctx));
    if (world > 1) {
        t.prev = forge_tensor_set_flags(forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 1), FORGE_FLAG_INPUT);
        t.total = forge_add(ctx, t.mg.loss, t.prev);
        CHECK(forge_graph_build_forward(t.g, t.total) == FORGE_OK, "total: %s", forge_ctx_error(ctx));
    }
    const int n_before = forge_graph_n_nodes(t.g);
    forge_status s = forge_graph_build_allreduce(t.g, world, bucket, t.total ? &t.total : nullptr, t.total ? 1 : 0);
    CHECK(s == FORGE_OK, "build_allreduce: %s", forge_ctx_error(ctx));
    if (world == 1) CHECK(forge_graph_n_nodes(t.g) == n_before, "world 1 added %d nodes", forge_graph_n_nodes(t.g) - n_before);
    t.hyper = forge_tensor_new_1d(ctx, FORGE_TYPE_F32, 8);
    t.adam = forge_graph_build_adamw(t.g, t.hyper);
    CHECK(t.adam != nullptr, "adamw: %s", forge_ctx_error(ctx));
    return t;
}

void check_buckets(const TrainGraph &t, size_t bucket) {
    forge_graph *g = t.g;
    const auto &nodes = g->nodes;
    std::map<const forge_tensor *, size_t> pos, last_acc;
    size_t last_lora_back = 0, adamw_at = 0;
    for (size_t i = 0; i < nodes.size(); i++) {
        pos[nodes[i]] = i;
        if (nodes[i]->op == FORGE_OP_ACC) last_acc[forge_view_root(nodes[i])] = i;
        if (nodes[i]->op == FORGE_OP_LORA_BACK) last_lora_back = i;
        if (nodes[i]->op == FORGE_OP_ADAMW) adamw_at = i;
    }
    std::map<const forge_tensor *, int> times; // gradient -> buckets holding it
    std::vector<size_t> at;
    for (size_t i = 0; i < nodes.size(); i++) {
        const forge_tensor *n = nodes[i];
        if (n->op != FORGE_OP_ALLREDUCE) continue;
        at.push_back(i);
        CHECK(n->op_i[0] == 2, "world %d", n->op_i[0]);
        size_t bytes = 0, last_bytes = 0;
        bool has_total = false;
        for (int k = 0; k < n->n_src; k++) {
            const forge_tensor *s = n->src[k];
            if (s == t.total) {
                has_total = true;
                continue;
            }
            const forge_tensor *root = forge_view_root(n->src[k]);
            CHECK(s->op == FORGE_OP_ACC && last_acc.count(root) && last_acc[root] < i, "%s reduced at node %zu before its last accumulation",
                  forge_tensor_name(root), i);
            times[root]++;
            bytes += forge_tensor_nbytes(s), last_bytes = forge_tensor_nbytes(s);
        }
        const bool last = n->name == std::string("allreduce.") + std::to_string(forge_graph_count_op(g, FORGE_OP_ALLREDUCE) - 1);
        CHECK(has_total == last, "the extra tensor is in bucket %s", n->name);
        if (!last) CHECK(bytes >= bucket && bytes - last_bytes < bucket, "bucket %s holds %zu bytes for a target of %zu", n->name, bytes, bucket);
        if (has_total) CHECK(pos[t.total] < i, "the loss total is reduced before it is computed");
        CHECK(i < adamw_at, "an all-reduce after the AdamW step");
    }
    CHECK(at.size() >= 3, "only %zu buckets", at.size());
    CHECK(!at.empty() && at[0] < last_lora_back, "the first all-reduce (node %zu) does not overlap the backward (last LoRA backward at %zu)",
          at.empty() ? 0 : at[0], last_lora_back);
    for (const auto &pg : g->grads) CHECK(times[pg.second] == 1, "gradient %s is in %d buckets", forge_tensor_name(pg.second), times[pg.second]);
    CHECK(forge_graph_check_plan(g) == FORGE_OK, "plan: %s", forge_ctx_error(g->ctx));
}

void test_allreduce_graph() {
    forge_ctx *ctx = forge_ctx_new();
    ModelConfig c;
    c.arch_name = "qwen2", c.vocab = 64, c.hidden = 32, c.n_layer = 3, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8, c.ffn = 48;
    c.attn_scale = 1.0f / std::sqrt(8.0f), c.qkv_bias = true;
    Model m;
    model_create(m, ctx, c, FORGE_TYPE_F32);
    LoraConfig lc;
    lc.r = 4;
    model_add_lora(m, lc);
    const size_t bucket = 6000; // a few LoRA tensors per bucket
    TrainGraph one = build_train(m, ctx, 1, bucket), two = build_train(m, ctx, 2, bucket);
    CHECK(forge_graph_count_op(one.g, FORGE_OP_ALLREDUCE) == 0, "world 1 has all-reduce nodes");
    CHECK(forge_graph_build_allreduce(two.g, 2, bucket, nullptr, 0) != FORGE_OK && has(forge_ctx_error(ctx), "once"),
          "a second call after AdamW is refused: %s", forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "(no error)");
    forge_ctx_clear_error(ctx);

    forge_backend *be = forge_backend_cpu_new(2);
    CHECK(forge_backend_alloc_graph(be, one.g) == FORGE_OK && forge_backend_alloc_graph(be, two.g) == FORGE_OK, "alloc: %s", forge_ctx_error(ctx));
    check_buckets(two, bucket);
    CHECK(forge_backend_set_dist(be, nullptr) == FORGE_OK, "a NULL communicator is one rank");

    // weights, LoRA and one batch; the same on both graphs
    Rng rng(7);
    for (forge_tensor *t : one.g->leafs) {
        const uint32_t f = forge_tensor_flags(t);
        if ((f & FORGE_FLAG_INPUT) || (f & FORGE_FLAG_PARAM) || t->type == FORGE_TYPE_I32 || (t->flags & (FORGE_FLAG_GRAD | FORGE_FLAG_OPT_STATE | FORGE_FLAG_ONES))) continue;
        fill_random(t, rng, 0.3f);
    }
    for (const Layer &y : m.layers) // nonzero B, so that every gradient is nonzero
        for (forge_tensor *t : {y.a_qkv, y.b_qkv, y.a_o, y.b_o, y.a_gu, y.b_gu, y.a_down, y.b_down}) fill_random(t, rng, 0.2f);
    std::vector<std::vector<float>> init;
    for (const auto &pg : one.g->grads) init.push_back(tensor_f32(pg.first));
    std::vector<int32_t> ids(16), pos(16), doc(16, 0), labels(16);
    for (int i = 0; i < 16; i++) ids[i] = rng.randint(64), pos[i] = i % 8, labels[i] = i % 5 == 4 ? FORGE_IGNORE_INDEX : rng.randint(64);
    const float hyper[8] = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1.0f, 1.0f}, count = 13.0f, zero = 0.0f;
    auto run = [&](TrainGraph &t) {
        const Batch &in = t.mg.in;
        set_i32(in.ids, ids), set_i32(in.pos, pos), set_i32(in.doc, doc), set_i32(in.labels, labels);
        forge_tensor_set(in.count, &count, 0, 4);
        forge_tensor_set(t.hyper, hyper, 0, sizeof hyper);
        if (t.prev) forge_tensor_set(t.prev, &zero, 0, 4);
        size_t i = 0;
        for (const auto &pg : t.g->grads) set_f32(const_cast<forge_tensor *>(pg.first), init[i++]);
        return forge_backend_compute(be, t.g);
    };
    CHECK(run(one) == FORGE_OK, "world 1 step: %s", forge_ctx_error(ctx));
    std::vector<std::vector<float>> after_one;
    for (const auto &pg : one.g->grads) after_one.push_back(tensor_f32(pg.first));
    const float loss_one = tensor_f32(one.mg.loss)[0], norm_one = tensor_f32(one.adam)[0];

    forge_backend_set_collectives(be, 0); // a micro-batch before the last: the same step, no collective
    CHECK(run(two) == FORGE_OK, "world 2 step, collectives off: %s", forge_ctx_error(ctx));
    size_t i = 0, differ = 0;
    for (const auto &pg : two.g->grads) differ += tensor_f32(pg.first) != after_one[i++];
    CHECK(differ == 0, "%zu LoRA tensors differ after the same step with the accumulations moved", differ);
    CHECK(tensor_f32(two.mg.loss)[0] == loss_one && tensor_f32(two.total)[0] == loss_one && tensor_f32(two.adam)[0] == norm_one,
          "loss %g / total %g / norm %g vs %g / %g", tensor_f32(two.mg.loss)[0], tensor_f32(two.total)[0], tensor_f32(two.adam)[0], loss_one, norm_one);
    forge_backend_set_collectives(be, 1);
    CHECK(run(two) != FORGE_OK && has(forge_ctx_error(ctx), "allreduce") && has(forge_ctx_error(ctx), "2 ranks"),
          "the CPU cannot all-reduce across 2 ranks: %s", forge_ctx_error(ctx) ? forge_ctx_error(ctx) : "(no error)");
    forge_ctx_clear_error(ctx);
    CHECK(forge_graph_arena_bytes(two.g, FORGE_ARENA_ACTIVATIONS) <= forge_graph_arena_bytes(one.g, FORGE_ARENA_ACTIVATIONS) + 1024,
          "early accumulation grew the activations: %zu vs %zu", forge_graph_arena_bytes(two.g, FORGE_ARENA_ACTIVATIONS),
          forge_graph_arena_bytes(one.g, FORGE_ARENA_ACTIVATIONS));
    forge_backend_free(be);
    forge_ctx_free(ctx);
}

} // namespace

int main() {
    test_env();
    test_rendezvous();
    test_allreduce_graph();
    std::printf("nccl version %d (0: built without NCCL)\n", forge_nccl_version());
    return test_finish("test-dist");
}
