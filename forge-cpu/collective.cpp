// forge-cpu/collective.cpp - ALLREDUCE on the CPU reference backend. The CPU backend has no
// communicator (forge_backend_set_dist accepts only one rank), so the sum over one rank is the
// tensor itself; a node built for several ranks is an error that names the op and the fix.
#include "cpu.h"

size_t forge_cpu_collective_work(const forge_tensor *, int) { return 0; }

void forge_cpu_collective(forge_tensor *node, const forge_cpu_params *p) {
    if (node->op_i[0] > 1)
        forge_cpu_fail(p, "an all-reduce across %d ranks needs the CUDA backend with NCCL and a communicator (forge_backend_set_dist)",
                       node->op_i[0]);
}
