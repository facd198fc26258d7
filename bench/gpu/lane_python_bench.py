#!/usr/bin/env python3
"""Issue 21's Python table on a GPU machine: a scheduler's call with its hidden rows as a torch CUDA
tensor, answers as torch CUDA tensors, timed with a stream synchronise after each call, three ways
side by side in one run (alternating rounds, median of the round p50s):
- grpc: RemoteDraftHead(lane="off") (host copies, one gRPC call);
- lane: RemoteDraftHead(lane="required") (the lane's CUDA arenas, stream-ordered, waiting on the host);
- original: the in-process original (the seed's Triton fp8 kernel over the full vocabulary, then
  torch's topk / argmax), on a twin of random weights of the server's shape (--seed-file).
Also the host time per call in the stream-ordered mode (wait=False, no synchronise in the timed
window), with fresh answer tensors and with the caller's own (out=, filled by the lane's C call). Prints Markdown. --profile=N: then N stream-ordered M=5 TOP_K calls under cProfile (a
synchronise every 8 calls), the 20 largest self times: where the host time of a call goes.
--pieces=N: the host time of each piece of a stream-ordered M=5 TOP_K call alone (the torch ops the
client makes, the libcuda calls its library makes, via ctypes), N calls each, beside the whole call
(with the library's copy kernel and without: Lane.copy_kernel):
what the 30 us budget a call is spent on, without a profiler's overhead.
--host-io: the lane only, its CUDA arenas against host IO (Lane.host_io: rows into the host arena,
token answers inline in the completion), alternating rounds in ABBA order: synchronised p50 and stream-ordered
host time with out=, M = 1, 5, 16, 64 TOP_K k = 8, M = 1 ARGMAX, M = 5 FULL bf16.
--host-copies: only gRPC with torch CUDA tensors, the client's copies all through pinned memory (the
rows in one DMA, the answers packed into one transfer) against all plain pageable torch copies
(t.to("cpu"), each answer's .to(device)), alternating rounds in ABBA order: M = 5 and 64 TOP_K
k = 8, M = 1 ARGMAX, M = 5 FULL bf16.
--transports: only the gRPC calls, grpcio's (transport="grpcio") against the native library's
(transport="native", libdrafthead_grpc.so), alternating rounds: torch CUDA and numpy rows, M = 5
TOP_K k = 8 and M = 1 ARGMAX, against the C++ load tester's p50 (--cpp-p50, measured beside).
--breakdown: only the lane, M = 5 TOP_K: a numpy caller against a torch CUDA one (synchronised, and
stream-ordered then synchronised) and a synchronise alone: where a GPU caller's time goes.
--versus=HOST:PORT: only the lane, against a second server (another build) in alternating rounds (ABBA):
M = 5 TOP_K k = 8, M = 1 ARGMAX, M = 5 FULL bf16.

    python3 bench/gpu/lane_python_bench.py --target=127.0.0.1:PORT --seed-file=bundle-gpu/seed/draft_head_fp8.py.txt
"""

import argparse
import cProfile
import ctypes
import pstats
import types
import statistics
import time

import numpy as np
import torch

import drafthead_client.lane as lanemod
from drafthead_client import RemoteDraftHead, float32_to_bf16


def case_label(mode, m):
    """A table row's name for a case: mode "topk" (k = 8), "argmax" or "full" (bf16) at M = m."""
    return {"topk": f"M={m} TOP_K k=8", "argmax": f"M={m} ARGMAX", "full": f"M={m} FULL_LOGITS bf16"}[mode]


def p(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def timed(fn, seconds, sync=True):
    """Per-call microseconds for `seconds` after a short warm-up."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    lat = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        lat.append((time.perf_counter() - t0) * 1e6)
        if not sync:
            torch.cuda.synchronize()  # outside the timed window
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--seed-file", default="")
    ap.add_argument("--ms", default="1,5,16,64")
    ap.add_argument("--seconds", type=float, default=1.5, help="per way, per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="")
    ap.add_argument("--profile", type=int, default=0, help="stream-ordered M=5 TOP_K calls to profile")
    ap.add_argument("--pieces", type=int, default=0, help="calls a piece in the host-time breakdown")
    ap.add_argument("--transports", action="store_true", help="grpcio vs the native unary call only")
    ap.add_argument("--host-io", action="store_true", help="the lane's CUDA arenas vs host IO only")
    ap.add_argument("--host-copies", action="store_true", help="gRPC torch: pinned vs pageable copies only")
    ap.add_argument("--breakdown", action="store_true", help="M=5 TOP_K over the lane: numpy vs torch CUDA "
                    "callers, and a synchronise alone")
    ap.add_argument("--versus", default="", help="HOST:PORT of a second server (another build): the lane "
                    "against it only")
    args = ap.parse_args()
    if args.transports:
        transports(args.target, args.seconds, args.rounds)
        return
    if args.host_copies:
        host_copies(args.target, args.seconds, args.rounds)
        return
    if args.versus:
        versus(args.target, args.versus, args.seconds, args.rounds)
        return
    if args.breakdown:
        breakdown(args.target, args.seconds, args.rounds)
        return

    lane = RemoteDraftHead(args.target, lane="required", timeout=30)
    grpc = RemoteDraftHead(args.target, lane="off", timeout=30)
    info = grpc.info()
    K, V = info["hidden_size"], info["vocab_size"]
    dev = torch.device("cuda")

    original = None
    if args.seed_file:
        # The seed is kept as text whose first line names where it came from: skip to the code.
        src = open(args.seed_file).read().split("\n")
        while src and not src[0].startswith(('"""', "import", "#", "from")):
            src.pop(0)
        seed = types.ModuleType("seed_head")
        exec(compile("\n".join(src), args.seed_file, "exec"), seed.__dict__)
        w = (torch.randn(V, K, device=dev) * 0.02).to(torch.bfloat16)
        twin = seed.make_twin(w)
        del w
        torch.cuda.empty_cache()

        def original(x, mode):
            y = seed.head_fp8(x, twin).to(torch.bfloat16)  # the original casts to the head's dtype
            if mode == "topk":
                return torch.topk(y, 8, dim=-1)
            if mode == "argmax":
                return torch.max(y, dim=-1)
            return y

    def lane_call(x, mode, wait=True):
        if mode == "topk":
            return lane.topk(x, 8, wait=wait)
        if mode == "argmax":
            return lane.argmax(x, wait=wait)
        return lane.logits(x, dtype="bf16", wait=wait)

    def lane_call_out(x, mode, out, wait=True):
        if mode == "topk":
            return lane.topk(x, 8, wait=wait, out=out)
        if mode == "argmax":
            return lane.argmax(x, wait=wait, out=out)
        return lane.logits(x, dtype="bf16", wait=wait, out=out)

    def grpc_call(x, mode):
        if mode == "topk":
            return grpc.topk(x, 8)
        if mode == "argmax":
            return grpc.argmax(x)
        return grpc.logits(x, dtype="bf16")

    if args.host_io:
        host_io_ab(lane, K, info["vocab_size"], dev, args.seconds, args.rounds, args.ms)
        lane.close()
        grpc.close()
        return
    if args.pieces > 0:
        pieces(lane, K, dev, args.pieces)
        lane.close()
        grpc.close()
        return
    cases = [("topk", m) for m in map(int, args.ms.split(","))] + [("argmax", 1), ("full", 5)]
    title = f" ({args.label})" if args.label else ""
    print(f"| Python, torch CUDA{title} | grpc p50 us | lane p50 us | lane p99 us | original p50 us | lane / original | "
          "lane host us/call, wait=False (p50) | same with out= |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, m in cases:
        x = torch.randn(m, K, device=dev).to(torch.bfloat16)
        lane_call(x, mode)  # opens the lane (with its CUDA arenas) outside the timing
        V = info["vocab_size"]
        out = {"topk": lambda: (torch.empty(m, 8, dtype=torch.int64, device=dev), torch.empty(m, 8, device=dev)),
               "argmax": lambda: (torch.empty(m, dtype=torch.int64, device=dev), torch.empty(m, device=dev)),
               "full": lambda: torch.empty(m, V, dtype=torch.bfloat16, device=dev)}[mode]()
        res = {"grpc": [], "lane": [], "lane_all": [], "original": [], "nowait": [], "nowait_out": []}
        for _ in range(args.rounds):
            res["grpc"].append(p(timed(lambda: grpc_call(x, mode), args.seconds), 0.5))
            lat = timed(lambda: lane_call(x, mode), args.seconds)
            res["lane"].append(p(lat, 0.5))
            res["lane_all"] += lat
            if original is not None:
                res["original"].append(p(timed(lambda: original(x, mode), args.seconds), 0.5))
            res["nowait"].append(p(timed(lambda: lane_call(x, mode, wait=False), args.seconds, sync=False), 0.5))
            lane.synchronize()
            res["nowait_out"].append(p(timed(lambda: lane_call_out(x, mode, out, wait=False), args.seconds,
                                             sync=False), 0.5))
            lane.synchronize()
        med = {k: statistics.median(v) if v else float("nan") for k, v in res.items() if k != "lane_all"}
        label = case_label(mode, m)
        ratio = med["lane"] / med["original"] if original is not None else float("nan")
        print(f"| {label} | {med['grpc']:.0f} | {med['lane']:.0f} | {p(res['lane_all'], 0.99):.0f} | "
              f"{med['original']:.0f} | {ratio:.2f} | {med['nowait']:.0f} | {med['nowait_out']:.0f} |", flush=True)
    if args.profile > 0:
        x = torch.randn(5, K, device=dev).to(torch.bfloat16)
        lane_call(x, "topk")
        out = (torch.empty(5, 8, dtype=torch.int64, device=dev), torch.empty(5, 8, device=dev))
        for label, call in (("fresh answer tensors", lambda: lane_call(x, "topk", wait=False)),
                            ("out=", lambda: lane_call_out(x, "topk", out, wait=False))):
            prof = cProfile.Profile()
            prof.enable()
            for i in range(args.profile):
                call()
                if i % 8 == 7:
                    lane.synchronize()
            prof.disable()
            lane.synchronize()
            print(f"\ncProfile of {args.profile} stream-ordered M=5 TOP_K calls, {label} (self time; a synchronise "
                  "every 8):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    lane.close()
    grpc.close()


def pieces(head, K, dev, n):
    """Host us of a stream-ordered call's pieces: the whole calls one at a time (median), the
    pieces alone (median of 64-call batches' means)."""
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    cu.cuStreamWriteValue32_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    cu.cuStreamWaitValue32_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    x = torch.randn(5, K, device=dev).to(torch.bfloat16)
    out = (torch.empty(5, 8, dtype=torch.int64, device=dev), torch.empty(5, 8, device=dev))
    head.topk(x, 8)  # opens the lane with its CUDA arenas
    lane = head.lane(cuda_device=x.device)
    pb = lane._pb
    word = torch.zeros(16, dtype=torch.int32, pin_memory=True)  # mapped: its host address is a device one
    dst = torch.empty_like(x)
    stream = torch.cuda.current_stream(dev).cuda_stream

    def each(fn, call, calls=n):
        """A lane call: each timed alone, synchronised after it outside the timing (64 without a
        wait would overrun the lane's depth and wait for the GPU); a piece: 64-call batches."""
        if call:
            lat = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                lat.append((time.perf_counter() - t0) * 1e6)
                head.synchronize()
                torch.cuda.synchronize()
            return statistics.median(lat)
        means = []
        for _ in range(max(1, n // 64)):
            t0 = time.perf_counter()
            for _ in range(64):
                fn()
            means.append((time.perf_counter() - t0) * 1e6 / 64)
            torch.cuda.synchronize()
        return statistics.median(means)

    rows = [
        ("the whole call, fresh answer tensors: head.topk(x, 8, wait=False)", lambda: head.topk(x, 8, wait=False)),
        ("the whole call, out=: head.topk(x, 8, wait=False, out=out)",
         lambda: head.topk(x, 8, wait=False, out=out)),
        ("Lane.call_cuda alone (the one C call and its Python wrapper)",
         lambda: lane.call_cuda(mode=pb.TOP_K, x=x, out_ptrs=(out[0].data_ptr(), out[1].data_ptr()), top_k=8,
                                wait=False)),
        ("lane._pack(...) (the 128-byte descriptor)",
         lambda: lanemod._pack(0, 5, pb.BF16, pb.TOP_K, 0, 0, 8, False, 1.0, 0, lanemod._NO_SLICE, (2, 0, 480),
                               fence=True, ids64=True)),
        ("head._check_out(out, TOP_K, 5 rows) (the out= checks)",
         lambda: head._check_out(out, pb.TOP_K, 5, lane, top_k=8, return_probs=False)),
        ("a ctypes call with no arguments (dh_lane_abi_version)", lambda: lane._lib.dh_lane_abi_version()),
        ("torch.cuda.current_stream(i).cuda_stream", lambda: torch.cuda.current_stream(0).cuda_stream),
        ("torch.empty((5, 8), int64, cuda)", lambda: torch.empty((5, 8), dtype=torch.int64, device=dev)),
        ("x.device != dev, x.dtype in (...), x.is_contiguous(), x.shape[-1]",
         lambda: (x.device != dev, x.dtype in (torch.bfloat16, torch.float32), x.is_contiguous(), x.shape[-1])),
        ("x.data_ptr(), x.numel() * x.element_size()", lambda: (x.data_ptr(), x.numel() * x.element_size())),
        ("cuMemcpyDtoDAsync 51200 B (ctypes)",
         lambda: cu.cuMemcpyDtoDAsync_v2(dst.data_ptr(), x.data_ptr(), 51200, stream)),
        ("cuStreamWriteValue32 to mapped host memory (ctypes)",
         lambda: cu.cuStreamWriteValue32_v2(stream, word.data_ptr(), 1, 0)),
        ("cuStreamWaitValue32, already met (ctypes)",
         lambda: cu.cuStreamWaitValue32_v2(stream, word.data_ptr(), 0, 0)),
    ]
    # The whole calls with the library's copy kernel and with libcuda copies, alternating in
    # ROUNDS rounds of n / ROUNDS calls (this VM's host speed drifts within a minute: one block
    # each way would compare two moments, not two ways), then the pieces alone.
    on, why = lane.copy_kernel(True)
    ways = (True, False) if on else (False,)
    rounds = 4
    per = {}
    for _ in range(rounds):
        for way in ways:
            lane.copy_kernel(way)
            for i, (label, fn) in enumerate(rows[:3]):
                per.setdefault((i, way), []).append(each(fn, True, max(1, n // rounds)))
    lane.copy_kernel(True)  # the library's default
    print(f"\n| piece of a stream-ordered M=5 TOP_K call ({n} calls; whole calls: {rounds} alternating rounds) "
          "| host us (median of the rounds) | the rounds' medians |")
    print("| --- | --- | --- |")
    for way in ways:
        for i, (label, fn) in enumerate(rows[:3]):
            v = per[(i, way)]
            print(f"| {label}, {'copy kernel' if way else 'libcuda copies'} | {statistics.median(v):.1f} | "
                  f"{' '.join(f'{x:.1f}' for x in v)} |", flush=True)
    if not on:
        print(f"| (the copy kernel is not in use: {why}) | | |")
    for label, fn in rows[3:]:
        print(f"| {label} | {each(fn, False):.1f} | |", flush=True)


def host_io_ab(head, K, V, dev, seconds, rounds, ms):
    """The lane's two ways for a GPU caller, alternating rounds (median of the rounds' p50s)."""
    x0 = torch.randn(1, K, device=dev).to(torch.bfloat16)
    head.topk(x0, 8)  # opens the lane with its CUDA arenas
    lane = head.lane(cuda_device=dev)
    on, why = lane.host_io(True)
    if not on:
        print(f"\n(host IO is not available: {why})")
        return
    cases = [("topk", m) for m in map(int, ms.split(","))] + [("argmax", 1), ("full", 5)]
    print("\n| Python, torch CUDA, over the lane | CUDA arenas p50 us | host IO p50 us | host IO / arenas | "
          "host us a call, wait=False out=: arenas / host IO | rounds' p50s (arenas; host IO) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, m in cases:
        x = torch.randn(m, K, device=dev).to(torch.bfloat16)
        out = {"topk": lambda: (torch.empty(m, 8, dtype=torch.int64, device=dev), torch.empty(m, 8, device=dev)),
               "argmax": lambda: (torch.empty(m, dtype=torch.int64, device=dev), torch.empty(m, device=dev)),
               "full": lambda: torch.empty(m, V, dtype=torch.bfloat16, device=dev)}[mode]()

        def call(wait, o=None):
            if mode == "topk":
                return head.topk(x, 8, wait=wait, out=o)
            if mode == "argmax":
                return head.argmax(x, wait=wait, out=o)
            return head.logits(x, dtype="bf16", wait=wait, out=o)

        sync, host = {False: [], True: []}, {False: [], True: []}
        for i in range(rounds):
            for way in ((False, True) if i % 2 == 0 else (True, False)):  # ABBA: no order bias
                lane.host_io(way)
                sync[way].append(p(timed(lambda: call(True), seconds), 0.5))
                host[way].append(p(timed(lambda: call(False, out), seconds, sync=False), 0.5))
                head.synchronize()
        a, b = statistics.median(sync[False]), statistics.median(sync[True])
        label = case_label(mode, m)
        print(f"| {label} | {a:.0f} | {b:.0f} | {b / a:.2f} | {statistics.median(host[False]):.1f} / "
              f"{statistics.median(host[True]):.1f} | {' '.join(f'{v:.0f}' for v in sync[False])}; "
              f"{' '.join(f'{v:.0f}' for v in sync[True])} |", flush=True)
    lane.host_io(True)  # the library's default


def host_copies(target, seconds, rounds):
    """gRPC p50 us a call with torch CUDA tensors, the client's copies all pageable (plain torch
    copies) against all pinned (drafthead_client._PINNED_MIN_BYTES set to 1 << 62 or 0, looked up at
    each call), alternating rounds, the first way changing each round (ABBA: no order bias)."""
    import drafthead_client as dcm
    default = dcm._PINNED_MIN_BYTES
    ways = {"pageable": 1 << 62, "pinned": 0}
    head = RemoteDraftHead(target, lane="off", timeout=30)
    K = head.info()["hidden_size"]
    dev = torch.device("cuda")
    x = {m: torch.randn(m, K, device=dev).to(torch.bfloat16) for m in (1, 5, 64)}
    cases = [("M=5 TOP_K k=8", lambda: head.topk(x[5], 8)), ("M=1 ARGMAX", lambda: head.argmax(x[1])),
             ("M=64 TOP_K k=8", lambda: head.topk(x[64], 8)),
             ("M=5 FULL_LOGITS bf16", lambda: head.logits(x[5], dtype="bf16"))]
    print(f"\n| Python over gRPC ({head.transport_in_use}), torch CUDA | pageable p50 us | pinned p50 us | "
          f"pinned / pageable | rounds (pageable; pinned) | the package pins from {default} bytes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, fn in cases:
        r = {w: [] for w in ways}
        for i in range(rounds):
            for w in (("pageable", "pinned") if i % 2 == 0 else ("pinned", "pageable")):
                dcm._PINNED_MIN_BYTES = ways[w]
                r[w].append(p(timed(fn, seconds), 0.5))
        a, b = statistics.median(r["pageable"]), statistics.median(r["pinned"])
        print(f"| {label} | {a:.0f} | {b:.0f} | {b / a:.2f} | {' '.join(f'{v:.0f}' for v in r['pageable'])}; "
              f"{' '.join(f'{v:.0f}' for v in r['pinned'])} | |", flush=True)
    dcm._PINNED_MIN_BYTES = default
    head.close()


def breakdown(target, seconds, rounds):
    """Where a GPU caller's synchronised call over the lane goes beyond a host caller's: M = 5 TOP_K
    k = 8 on one lane, alternating rounds (median of the rounds' p50s): numpy rows and answers (a host
    caller: beside the C++ client's p50, what Python adds), torch CUDA rows and answers (host IO, the
    default) synchronised after each call, the same stream-ordered (wait=False) then synchronised,
    the same into the caller's out= tensors (allocated once, or just before each call), and
    torch.cuda.synchronize() alone."""
    head = RemoteDraftHead(target, lane="required", timeout=30)
    K, dev = head.info()["hidden_size"], torch.device("cuda")
    xn = float32_to_bf16(np.random.default_rng(5).standard_normal((5, K), dtype=np.float32))
    xt = torch.randn(5, K, device=dev).to(torch.bfloat16)
    outs = (torch.empty(5, 8, dtype=torch.int64, device=dev), torch.empty(5, 8, device=dev))
    ways = {"numpy rows and answers": (lambda: head.topk(xn, 8), False),
            "torch CUDA, synchronised": (lambda: head.topk(xt, 8), True),
            "torch CUDA, wait=False, synchronised": (lambda: head.topk(xt, 8, wait=False), True),
            # Session 24's split (submit, allocate, finish) against its two bounds: no allocation at
            # all, and the allocation before the call (the path before the split, plus out='s checks).
            "torch CUDA, out= (no allocation), synchronised": (lambda: head.topk(xt, 8, out=outs), True),
            "torch CUDA, allocated just before, out=, synchronised": (
                lambda: head.topk(xt, 8, out=(torch.empty(5, 8, dtype=torch.int64, device=dev),
                                              torch.empty(5, 8, device=dev))), True),
            "torch.cuda.synchronize() alone": (lambda: None, True)}
    for fn, _ in ways.values():
        fn()  # opens the lane (host, then replaced by one with CUDA arenas) outside the timing
    print(f"# the lane's CUDA arenas: {head.lane().cuda} ({head.lane().cuda_error or 'in use'})")
    res = {k: [] for k in ways}
    for r in range(rounds):
        for name in (list(ways) if r % 2 == 0 else list(reversed(list(ways)))):
            fn, sync = ways[name]
            res[name].append(p(timed(fn, seconds, sync=sync), 0.5))
    print("| lane, M=5 TOP_K k=8 | p50 us | rounds |")
    print("| --- | --- | --- |")
    for name, v in res.items():
        print(f"| {name} | {statistics.median(v):.0f} | {' '.join(f'{x:.0f}' for x in v)} |", flush=True)
    head.close()


def versus(target, other, seconds, rounds):
    """The lane's synchronised p50 against two servers (--target: this build, --versus: another), with
    torch CUDA tensors, alternating rounds in ABBA order: M = 5 TOP_K k = 8, M = 1 ARGMAX, M = 5
    FULL bf16 (its logits into the lane's CUDA output arena)."""
    heads = {"this": RemoteDraftHead(target, lane="required", timeout=30),
             "other": RemoteDraftHead(other, lane="required", timeout=30)}
    info = heads["this"].info()
    K, dev = info["hidden_size"], torch.device("cuda")

    def call(h, x, mode):
        if mode == "topk":
            return h.topk(x, 8)
        if mode == "argmax":
            return h.argmax(x)
        return h.logits(x, dtype="bf16")

    print("| lane, torch CUDA, synchronised | this p50 us | other p50 us | this / other | rounds this | rounds other |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, m in (("topk", 5), ("argmax", 1), ("full", 5)):
        x = torch.randn(m, K, device=dev).to(torch.bfloat16)
        for h in heads.values():
            call(h, x, mode)  # opens the lane (with its CUDA arenas) outside the timing
        res = {"this": [], "other": []}
        for r in range(rounds):
            for name in (("this", "other") if r % 4 in (0, 3) else ("other", "this")):
                res[name].append(p(timed(lambda: call(heads[name], x, mode), seconds), 0.5))
        a, b = statistics.median(res["this"]), statistics.median(res["other"])
        label = case_label(mode, m)
        print(f"| {label} | {a:.0f} | {b:.0f} | {a / b:.3f} | {' '.join(f'{v:.0f}' for v in res['this'])} | "
              f"{' '.join(f'{v:.0f}' for v in res['other'])} |", flush=True)
    for h in heads.values():
        h.close()


def transports(target, seconds, rounds):
    """gRPC p50 us a call, transport="grpcio" vs "native", alternating rounds (median of the rounds'
    p50s, and each round's)."""
    import numpy as np
    heads = {t: RemoteDraftHead(target, lane="off", transport=t, timeout=30) for t in ("grpcio", "native")}
    K = heads["grpcio"].info()["hidden_size"]
    dev = torch.device("cuda")
    xt = {m: torch.randn(m, K, device=dev).to(torch.bfloat16) for m in (1, 5)}
    xn = {m: np.random.default_rng(m).standard_normal((m, K)).astype(np.float32) for m in (1, 5)}
    cases = [("torch CUDA, M=5 TOP_K k=8", lambda h: h.topk(xt[5], 8)),
             ("torch CUDA, M=1 ARGMAX", lambda h: h.argmax(xt[1])),
             ("torch CUDA, M=5 FULL_LOGITS bf16", lambda h: h.logits(xt[5], dtype="bf16")),
             ("numpy fp32, M=5 TOP_K k=8", lambda h: h.topk(xn[5], 8)),
             ("numpy fp32, M=1 ARGMAX", lambda h: h.argmax(xn[1])),
             # native: the logits copied once off the wire (dh_grpc_finish_split); grpcio: through the message
             ("numpy fp32, M=5 FULL_LOGITS bf16", lambda h: h.logits(xn[5], dtype="bf16"))]
    print(f"\n| Python over gRPC (transport in use: {heads['native'].transport_in_use} / grpcio) | grpcio p50 us | "
          "native p50 us | native / grpcio | rounds (grpcio; native) |")
    print("| --- | --- | --- | --- | --- |")
    for label, fn in cases:
        r = {t: [] for t in heads}
        for _ in range(rounds):
            for t, h in heads.items():
                r[t].append(p(timed(lambda: fn(h), seconds), 0.5))
        g, n = statistics.median(r["grpcio"]), statistics.median(r["native"])
        print(f"| {label} | {g:.0f} | {n:.0f} | {n / g:.2f} | {' '.join(f'{v:.0f}' for v in r['grpcio'])}; "
              f"{' '.join(f'{v:.0f}' for v in r['native'])} |", flush=True)
    for h in heads.values():
        h.close()


if __name__ == "__main__":
    main()
