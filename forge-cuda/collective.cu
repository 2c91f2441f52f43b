// forge-cuda/collective.cu - data parallelism over NCCL: the communicator (forge_dist_*) and the
// ALLREDUCE node.
//
// An ALLREDUCE node sums a bucket of F32 tensors in place across the ranks. It runs on a second,
// high-priority "comm" stream so that the rest of the backward pass overlaps it: the node records
// an event on the main stream, the comm stream waits for it, one ncclGroupStart/End encloses an
// in-place ncclAllReduce(ncclSum) per tensor, and an event recorded on the comm stream marks the
// end. The launcher (backend.cu) calls forge_cuda_comm_before for every node: when the node reads
// or writes memory that is still being reduced (the AdamW step reads every gradient), the main
// stream waits for that event first; forge_cuda_comm_join does the same at the end of the step.
// All of it is legal inside a CUDA-graph capture (events fork and join the captured streams, and
// NCCL's kernels are capturable), so the step stays one CUDA graph. Events and the stream are
// made once, when the communicator is attached; nothing is created inside a step. NCCL's ring
// all-reduce of the same inputs gives the same result on every rank, run after run.
#include "cuda.cuh"

#include <algorithm>

#ifdef FORGE_HAVE_NCCL
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == FORGE_DIST_ID_BYTES, "NCCL's unique id size changed");

struct forge_dist {
    ncclComm_t comm;
    int rank, world, device;
};

static forge_status nccl_fail(const char *what, ncclResult_t r, ncclComm_t comm) {
    const char *last = ncclGetLastError(comm);
    forge_dist_set_error("%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    return FORGE_ERR_RUNTIME;
}

int forge_nccl_version(void) {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

forge_status forge_dist_unique_id(unsigned char id[FORGE_DIST_ID_BYTES]) {
    if (!id) return FORGE_ERR_INVALID_ARG;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail("ncclGetUniqueId", r, nullptr);
    std::memcpy(id, u.internal, FORGE_DIST_ID_BYTES);
    return FORGE_OK;
}

forge_status forge_dist_new(const unsigned char id[FORGE_DIST_ID_BYTES], int rank, int world, int device, forge_dist **out) {
    if (!out) return FORGE_ERR_INVALID_ARG;
    *out = nullptr;
    if (!id || world < 1 || rank < 0 || rank >= world) {
        forge_dist_set_error("forge_dist_new: rank %d of %d ranks (want 0 <= rank < world)", rank, world);
        return FORGE_ERR_INVALID_ARG;
    }
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        forge_dist_set_error("forge_dist_new: rank %d: cuda:%d: %s", rank, device, cudaGetErrorString(e));
        return FORGE_ERR_RUNTIME;
    }
    ncclUniqueId u;
    std::memcpy(u.internal, id, FORGE_DIST_ID_BYTES);
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, world, u, rank);
    if (r != ncclSuccess) {
        const std::string what = "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(world) + " on cuda:" +
                                 std::to_string(device) + ")";
        return nccl_fail(what.c_str(), r, nullptr);
    }
    *out = new forge_dist{comm, rank, world, device};
    return FORGE_OK;
}

void forge_dist_abort(forge_dist *d) {
    if (d && d->comm) ncclCommAbort(d->comm);
    if (d) d->comm = nullptr;
}

void forge_dist_free(forge_dist *d) {
    if (!d) return;
    if (d->comm) ncclCommDestroy(d->comm);
    delete d;
}

int forge_dist_rank(const forge_dist *d) { return d ? d->rank : 0; }
int forge_dist_world(const forge_dist *d) { return d ? d->world : 1; }

struct forge_cuda_comm {
    forge_dist *dist;
    cudaStream_t stream = nullptr;
    cudaEvent_t fork = nullptr, done = nullptr;
    bool on = true;
    std::vector<const forge_tensor *> pending; // memory (view roots) being reduced since the last wait
    std::string error;
};

forge_cuda_comm *forge_cuda_comm_new(forge_dist *d, int device, std::string *err) {
    if (d->device != device) {
        *err = "the communicator of rank " + std::to_string(d->rank) + " was made for cuda:" + std::to_string(d->device) +
               ", not cuda:" + std::to_string(device);
        return nullptr;
    }
    forge_cuda_comm *c = new forge_cuda_comm();
    c->dist = d;
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi); // hi: the greatest priority
    cudaError_t e = cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, hi);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        *err = std::string("creating the comm stream and its events: ") + cudaGetErrorString(e);
        forge_cuda_comm_free(c);
        return nullptr;
    }
    return c;
}

void forge_cuda_comm_free(forge_cuda_comm *c) {
    if (!c) return;
    if (c->fork) cudaEventDestroy(c->fork);
    if (c->done) cudaEventDestroy(c->done);
    if (c->stream) cudaStreamDestroy(c->stream);
    delete c;
}

void forge_cuda_comm_enable(forge_cuda_comm *c, bool on) { c->on = on; }
int forge_cuda_comm_world(const forge_cuda_comm *c) { return c->dist->world; }

std::string forge_cuda_comm_take_error(forge_cuda_comm *c) {
    std::string e;
    std::swap(e, c->error);
    return e;
}

static void comm_error(forge_cuda_comm *c, const std::string &what) {
    if (c->error.empty()) c->error = what;
}

void forge_cuda_collective(forge_tensor *node, const forge_cuda_params *p) {
    forge_cuda_comm *c = p->comm;
    if (!c || !c->on || node->op != FORGE_OP_ALLREDUCE) return;
    cudaError_t e = cudaEventRecord(c->fork, p->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream, c->fork, 0);
    if (e != cudaSuccess) return comm_error(c, std::string("allreduce: forking the comm stream: ") + cudaGetErrorString(e));
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < node->n_src && r == ncclSuccess; i++) {
        forge_tensor *t = node->src[i];
        r = ncclAllReduce(t->data, t->data, (size_t)forge_tensor_nelements(t), ncclFloat, ncclSum, c->dist->comm, c->stream);
        c->pending.push_back(forge_view_root(t));
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) {
        const char *last = ncclGetLastError(c->dist->comm);
        return comm_error(c, std::string("allreduce (") + node->name + "): " + ncclGetErrorString(r) + (last && *last ? ": " : "") + (last ? last : ""));
    }
    if ((e = cudaEventRecord(c->done, c->stream)) != cudaSuccess)
        comm_error(c, std::string("allreduce: recording the comm stream's event: ") + cudaGetErrorString(e));
}

static void comm_wait(const forge_cuda_params *p) {
    forge_cuda_comm *c = p->comm;
    cudaError_t e = cudaStreamWaitEvent(p->stream, c->done, 0);
    if (e != cudaSuccess) comm_error(c, std::string("waiting for the comm stream: ") + cudaGetErrorString(e));
    c->pending.clear();
}

void forge_cuda_comm_before(const forge_tensor *node, const forge_cuda_params *p) {
    forge_cuda_comm *c = p->comm;
    if (!c || c->pending.empty()) return;
    auto busy = [&](forge_tensor *t) { return t && std::find(c->pending.begin(), c->pending.end(), forge_view_root(t)) != c->pending.end(); };
    bool touches = busy(const_cast<forge_tensor *>(node));
    for (int i = 0; i < node->n_src && !touches; i++) touches = busy(node->src[i]);
    if (touches) comm_wait(p);
}

void forge_cuda_comm_join(const forge_cuda_params *p) {
    if (p->comm && !p->comm->pending.empty()) comm_wait(p);
}

#else // built without NCCL: forge.cu has the forge_dist_* stubs; no communicator can exist

struct forge_cuda_comm {};
forge_cuda_comm *forge_cuda_comm_new(forge_dist *, int, std::string *err) {
    *err = "forge was built without NCCL";
    return nullptr;
}
void forge_cuda_comm_free(forge_cuda_comm *) {}
void forge_cuda_comm_enable(forge_cuda_comm *, bool) {}
int forge_cuda_comm_world(const forge_cuda_comm *) { return 1; }
std::string forge_cuda_comm_take_error(forge_cuda_comm *) { return ""; }
void forge_cuda_collective(forge_tensor *, const forge_cuda_params *) {}
void forge_cuda_comm_before(const forge_tensor *, const forge_cuda_params *) {}
void forge_cuda_comm_join(const forge_cuda_params *) {}

#endif

size_t forge_cuda_collective_work(const forge_tensor *) { return 0; }
