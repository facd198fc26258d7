#!/usr/bin/env python3
"""Two drafthead servers with the same weights asked the same calls, every answer compared bit for
bit: every mode (full logits fp32 / bf16, top-k with probs, argmax, sample), M = 1, 5, 17, 64, each
call alone and then the whole set at once (so that calls batch together). Prints a Markdown table
and exits 1 on any difference. Used by bench/gpu/group.sh (a tp=2 group over NCCL, its rows sent
GPU to GPU, against the same group over Gloo).

  group_compare.py --a=HOST:PORT --b=HOST:PORT [--seed=S]
"""
import argparse
import concurrent.futures as cf
import sys

import numpy as np

import drafthead_client as dh


def calls(K, seed):
    rng = np.random.default_rng(seed)
    out = []
    for m in (1, 5, 17, 64):
        x = rng.standard_normal((m, K), dtype=np.float32)
        out += [
            (f"FULL fp32 M={m}", lambda h, x=x: [h.logits(x, dtype="fp32", hidden_dtype="fp32")]),
            (f"FULL bf16 M={m}", lambda h, x=x: [h.logits(x, dtype="bf16", hidden_dtype="fp32")]),
            (f"TOP_K k=8 probs T=0.7 M={m}",
             lambda h, x=x: list(h.topk(x, 8, probs=True, temperature=0.7, hidden_dtype="fp32"))),
            (f"ARGMAX M={m}", lambda h, x=x: list(h.argmax(x, hidden_dtype="fp32"))),
            (f"SAMPLE T=1.3 M={m}", lambda h, x=x: list(h.sample(x, temperature=1.3, seed=7, hidden_dtype="fp32"))),
        ]
    return out


def same(a, b):
    return len(a) == len(b) and all(
        (p is None and q is None) or (p is not None and q is not None and np.asarray(p).dtype == np.asarray(q).dtype
                                      and np.array_equal(np.asarray(p).view(np.uint8), np.asarray(q).view(np.uint8)))
        for p, q in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    ha, hb = dh.RemoteDraftHead(args.a, lane="off"), dh.RemoteDraftHead(args.b, lane="off")
    K = ha.info()["hidden_size"]
    if hb.info()["hidden_size"] != K:
        sys.exit("the two servers differ in hidden size")
    todo = calls(K, args.seed)
    bad = 0
    print(f"| call | {args.a} vs {args.b}: alone | together (batched) |")
    print("| --- | --- | --- |")
    with cf.ThreadPoolExecutor(len(todo)) as pool:
        together = {}
        for h, name in ((ha, "a"), (hb, "b")):
            futs = [pool.submit(fn, h) for _, fn in todo]
            together[name] = [f.result() for f in futs]
    for i, (label, fn) in enumerate(todo):
        alone = same(fn(ha), fn(hb))
        batched = same(together["a"][i], together["b"][i])
        bad += (not alone) + (not batched)
        print(f"| {label} | {'equal' if alone else 'DIFFERENT'} | {'equal' if batched else 'DIFFERENT'} |")
    print(f"\n{len(todo) * 2 - bad} of {len(todo) * 2} comparisons equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
