#!/usr/bin/env python3
"""Drives bench/harness-experiment.cu (build it first, see there): c = a + b in bf16 and the
embedding gather (uniform ids) by PyTorch (eager and torch.compile, static shapes) and by forge's
kernels and variants, all timed by one harness - bench/peers/ops.py's: events around
each run, the L2 flushed before it - under three flushes: PyTorch's zero_() of 256 MB (the peers'
harness), cudaMemsetAsync of the same (bench-kernels'), and a kernel that only reads 256 MB (no
dirty lines left in L2 for the timed kernel to write back). Two rounds, median of 40 each.

    python3 bench/harness-experiment.py [/tmp/libhx.so]
"""
import ctypes
import sys

import torch

lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "/tmp/libhx.so")
lib.hx_add.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
lib.hx_gather.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
lib.hx_memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
lib.hx_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]

FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
SINK = torch.empty(16, dtype=torch.uint8, device="cuda")
stream = lambda: torch.cuda.current_stream().cuda_stream


def flush(kind, i):
    if kind == "zero_":
        FLUSH.zero_()
    elif kind == "memset":
        assert lib.hx_memset(FLUSH.data_ptr(), i & 0xFF, FLUSH.numel(), stream()) == 0
    else:
        assert lib.hx_read(FLUSH.data_ptr(), FLUSH.numel(), SINK.data_ptr(), stream()) == 0


def bench(run, kind, reps=40):
    for i in range(3):
        run()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (s, e) in enumerate(ev):
        flush(kind, i)
        s.record()
        run()
        e.record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in ev)
    return 1e3 * ms[reps // 2]


VARIANTS = ["forge map (stride, prologue, PDL)", "stride, plain", "flat 1 unit x 128", "flat 2 units x 128",
            "flat 1 unit x 256", "flat 4 units x 128"]
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median of 40, us")
for N, C in ((16384, 896), (4096, 896), (16384, 2304)):
    a = torch.randn(N, C, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    ref = a + b
    add_c = torch.compile(lambda x, y: x + y, dynamic=False)  # a fresh one per shape, as the peers' harness
    runs = {"torch a + b": lambda: a + b, "torch.add(out=)": lambda: torch.add(a, b, out=c), "torch.compile a + b": lambda: add_c(a, b)}
    for v, name in enumerate(VARIANTS):
        runs[name] = lambda v=v: lib.hx_add(v, a.data_ptr(), b.data_ptr(), c.data_ptr(), a.numel(), stream())
        c.zero_()
        runs[name]()
        torch.cuda.synchronize()
        assert torch.equal(c, ref), name
    for kind in ("zero_", "memset", "read"):
        for name, run in runs.items():
            t = [bench(run, kind) for _ in range(2)]
            print(f"add {N:5}x{C:<5} flush {kind:6} {name:36} {t[0]:7.2f} {t[1]:7.2f}", flush=True)

GATHER = ["forge gather (stride, prologue, PDL)", "flat 1 unit x 256", "a warp per token", "flat 1 unit x 128, loads first",
          "flat 2 units x 128, loads first", "flat 4 units x 128, loads first", "flat 2 units x 256, loads first"]
for V, C, N in ((151936, 896, 16384), (151936, 1024, 16384), (151936, 896, 4096), (256000, 2304, 16384)):
    table = torch.randn(V, C, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, V, (N,), device="cuda", dtype=torch.int32)
    ids64 = ids.long()
    out = torch.empty(N, C, device="cuda", dtype=torch.bfloat16)
    ref = table[ids64]
    compiled = torch.compile(lambda i, t: torch.nn.functional.embedding(i, t), dynamic=False)
    runs = {"torch F.embedding": lambda: torch.nn.functional.embedding(ids64, table),
            "torch.compile F.embedding": lambda: compiled(ids64, table)}
    for v, name in enumerate(GATHER):
        runs[name] = lambda v=v: lib.hx_gather(v, ids.data_ptr(), table.data_ptr(), out.data_ptr(), N, C, stream())
        out.zero_()
        runs[name]()
        torch.cuda.synchronize()
        assert torch.equal(out, ref), name
    for kind in ("zero_", "read"):
        for name, run in runs.items():
            t = [bench(run, kind) for _ in range(2)]
            print(f"gather {N:5} tok {V}x{C:<5} flush {kind:6} {name:36} {t[0]:7.2f} {t[1]:7.2f}", flush=True)
