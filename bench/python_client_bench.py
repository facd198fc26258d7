#!/usr/bin/env python3
"""Latency of the Python client as a scheduler sees it (issue 11): one call at a time, hidden rows
in (torch on the GPU when --device=cuda, else numpy bf16 bits), results back where the input lives
(torch: on the input's device, synchronized before the clock stops). Prints one Markdown row per
case: calls measured, p50 / p90 / p99 in microseconds, and the calling thread's CPU time per call
(the client's own work, which a loaded host's wall clock buries under scheduling delays). With the
drafthead_client package importable (its wheel installed, or bench/gpu/env.sh's bundle on the GPU
machine):

    python3 bench/python_client_bench.py --target=127.0.0.1:50051 --device=cuda --seconds=5
"""

import argparse
import sys
import time

import numpy as np

from drafthead_client import RemoteDraftHead

try:
    import torch  # type: ignore
except ImportError:  # numpy only
    torch = None


def percentile(sorted_us, q):
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--device", default="cpu", help="cuda: torch tensors on the GPU; cpu: torch on the CPU "
                    "(numpy when torch is missing); numpy: numpy bf16 bits")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured time per case")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--cases", default="topk5,argmax1,full5", help="comma-separated: topk5, argmax1, full5")
    ap.add_argument("--lane", default="off", help="comma-separated lane modes to compare (off, auto, required); "
                    "each case runs once per mode per round, alternating")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()

    heads = {mode: RemoteDraftHead(args.target, timeout=10.0, lane=mode) for mode in args.lane.split(",")}
    head = next(iter(heads.values()))
    info = head.info()
    K = int(info["hidden_size"])
    rng = np.random.default_rng(1)
    use_torch = torch is not None and args.device != "numpy"
    if args.device == "cuda" and (torch is None or not torch.cuda.is_available()):
        sys.exit("python_client_bench: --device=cuda needs torch with CUDA")

    def hidden(rows):
        x = rng.standard_normal((rows, K)).astype(np.float32)
        if not use_torch:
            return (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits (truncated: any values do)
        return torch.from_numpy(x).to(torch.bfloat16).to(args.device)

    def sync():
        if use_torch and args.device == "cuda":
            torch.cuda.synchronize()

    cases = {
        "topk5": ("M=5 TOP_K k=8", 5, lambda head, h: head.topk(h, 8)),
        "argmax1": ("M=1 ARGMAX", 1, lambda head, h: head.argmax(h)),
        "full5": ("M=5 FULL_LOGITS bf16", 5, lambda head, h: head.logits(h, dtype="bf16")),
    }
    kind = f"torch {args.device}" if use_torch else "numpy bf16"
    print(f"| python client ({kind}) | lane | calls | p50 us | p90 us | p99 us | client CPU us/call |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, lane_mode, _ in [(n, m, r) for r in range(args.rounds) for n in args.cases.split(",") for m in heads]:
        label, rows, case = cases[name]
        call = (lambda head: lambda h: case(head, h))(heads[lane_mode])
        x = hidden(rows)
        call(x)  # a lane opens on the first call, outside the timing
        sync()
        lat = []
        t_end_warm = time.perf_counter() + args.warmup
        t_end = t_end_warm + args.seconds
        cpu0 = None
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                break
            if cpu0 is None and t0 >= t_end_warm:
                cpu0 = time.thread_time()
            out = call(x)
            sync()  # the results are on the input's device and usable
            t1 = time.perf_counter()
            if t0 >= t_end_warm:
                lat.append((t1 - t0) * 1e6)
            del out
        cpu_us = (time.thread_time() - cpu0) * 1e6 / max(1, len(lat)) if cpu0 is not None else float("nan")
        lat.sort()
        print(f"| {label} | {lane_mode} | {len(lat)} | {percentile(lat, 0.5):.1f} | {percentile(lat, 0.9):.0f} | "
              f"{percentile(lat, 0.99):.0f} | {cpu_us:.0f} |", flush=True)
    for h in heads.values():
        h.close()


if __name__ == "__main__":
    main()
