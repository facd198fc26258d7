#!/usr/bin/env python3
"""The Python lane call's own host cost, robust to a loaded host: one call at a time over a lane whose
caller does not spin (spin_us=0: it sleeps on the doorbell, so the time it waits for the server costs
it no CPU), timing each call's wall clock and this thread's CPU time. The CPU time per call is the
client's own work (the plan, lane.py, the library, the futex calls), which the wall clock on a
shared 2-core host buries under scheduling delays. Run once per package to compare (PYTHONPATH):

    PYTHONPATH=<staged package> python3 bench/lane_python_host_bench.py --target=127.0.0.1:PORT
"""
import argparse
import statistics
import time

import numpy as np

import drafthead_client as dc
import drafthead_client.lane as lanemod


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    # Lane(pb, stub, info, call, error_type, depth=8, spin_us=200, cuda_device=None): no spinning.
    depth, _, cuda = lanemod.Lane.__init__.__defaults__
    lanemod.Lane.__init__.__defaults__ = (depth, 0, cuda)
    head = dc.RemoteDraftHead(args.target, lane="required", timeout=10)
    K = head.info()["hidden_size"]
    rng = np.random.default_rng(1)
    cases = {"M=1 ARGMAX": (1, lambda x: head.argmax(x)), "M=5 TOP_K k=8": (5, lambda x: head.topk(x, 8))}
    for name, (rows, call) in cases.items():
        x = (rng.standard_normal((rows, K)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        for _ in range(200):
            call(x)
        wall, cpu = [], []
        for _ in range(args.calls):
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            call(x)
            cpu.append((time.thread_time_ns() - c0) / 1e3)
            wall.append((time.perf_counter_ns() - w0) / 1e3)
        print(f"| {args.label} | {name} | {statistics.median(cpu):.1f} | {statistics.mean(cpu):.1f} | "
              f"{statistics.median(wall):.1f} |", flush=True)
    head.close()


if __name__ == "__main__":
    main()
