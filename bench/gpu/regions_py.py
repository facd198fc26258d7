"""The Python half of bench/gpu/regions.sh: a scheduler's calls from a separate process with torch
CUDA tensors, through the bytes path and through CUDA IPC regions, checked equal bit for bit, then
timed (c = 1). Prints one JSON object per line: {"mode", "way", "p50_us", "p99_us", "calls"}, or
{"skip": reason}. Also runs drafthead_client.dspark_adapter's CUDA transport against a stand-in
DSpark module and checks it against the bytes path.

    python3 bench/gpu/regions_py.py TARGET [CALLS]
"""
import json
import sys
import time
import types

import numpy as np

import drafthead_client as dc
from drafthead_client import dspark_adapter
from drafthead_client.regions import CudaRegion

try:
    import torch
except ImportError:
    print(json.dumps({"skip": "torch is not installed"}))
    sys.exit(0)
if not torch.cuda.is_available():
    print(json.dumps({"skip": "torch sees no CUDA device"}))
    sys.exit(0)

target = sys.argv[1]
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 400
M = 5
head = dc.RemoteDraftHead(target, timeout=60)
info = head.info()
K, V = info["hidden_size"], info["vocab_size"]
dev = torch.device("cuda", 0)
x = (torch.randn(M, K, device=dev) * 0.5).to(torch.bfloat16)

hid_buf = torch.empty(64, K, dtype=torch.bfloat16, device=dev)
out_buf = torch.empty(64, V, dtype=torch.bfloat16, device=dev)
hid = CudaRegion.from_tensor(head, "bench.hid", hid_buf)
out = CudaRegion.from_tensor(head, "bench.out", out_buf)


def full_bytes():
    return head.logits(x)  # torch in, torch out on the same device: host copies both ways


def full_region():
    hid_buf[:M].copy_(x)
    torch.cuda.current_stream().synchronize()
    head.compute_in_regions("full", M, hid.slice_of(hid_buf[:M]), logits_region=out.slice_of(out_buf[:M]))
    return out_buf[:M]


def topk_bytes():
    return head.topk(x, 8).ids


def topk_region():
    hid_buf[:M].copy_(x)
    torch.cuda.current_stream().synchronize()
    r = head.compute_in_regions("topk", M, hid.slice_of(hid_buf[:M]), k=8)
    return torch.tensor(list(r.token_ids), dtype=torch.int64, device=dev).view(M, 8)


# Equal bit for bit before timing anything.
assert torch.equal(full_bytes(), full_region().clone()), "FULL_LOGITS: CUDA region != bytes path"
assert torch.equal(topk_bytes(), topk_region()), "TOP_K: CUDA region != bytes path"


# The adapter's CUDA transport on a stand-in DSpark module, against the bytes path.
class _Stage:
    def norm(self, t):
        return t


class DeepseekV4ForCausalLMDSpark:
    _opt_markov_w2_tp_shard = False

    def __init__(self):
        self.stages = [_Stage()]
        self.lm_head = types.SimpleNamespace(weight=torch.empty(1, K, dtype=torch.bfloat16, device=dev))

    def _logits_from_x_post_hc(self, x_post_hc):
        raise AssertionError("the stock head ran: the adapter did not serve")


mod = types.SimpleNamespace(DeepseekV4ForCausalLMDSpark=DeepseekV4ForCausalLMDSpark,
                            gather_and_crop_vocab=lambda local, lm: local)
remote = dspark_adapter.install(mod, target=target)
y = DeepseekV4ForCausalLMDSpark()._logits_from_x_post_hc(x)
assert y.shape == (M, V) and y.dtype == torch.bfloat16 and y.device == dev
assert torch.equal(y, full_bytes()), "dspark adapter (CUDA regions) != bytes path"
remote.transport.close()
print(json.dumps({"check": "CUDA regions == bytes path (full, top_k, dspark adapter)", "ok": True}), flush=True)


def timed(fn):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        torch.cuda.current_stream().synchronize()  # the answer is usable on the GPU
        t.append((time.perf_counter() - t0) * 1e6)
    return float(np.percentile(t, 50)), float(np.percentile(t, 99))


for mode, way, fn in (("full_bf16", "bytes", full_bytes), ("full_bf16", "cuda", full_region),
                      ("topk8", "bytes", topk_bytes), ("topk8", "cuda", topk_region)):
    p50, p99 = timed(fn)
    print(json.dumps({"mode": mode, "way": way, "p50_us": p50, "p99_us": p99, "calls": calls}), flush=True)
hid.close()
out.close()
