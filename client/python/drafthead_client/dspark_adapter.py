"""The DSpark draft's LM head on a drafthead server, through a same-host lane or CUDA shared-memory
regions. Default OFF.

DRAFTHEAD_DSPARK_TARGET=HOST:PORT arms it (the server on this host, started with
--shared-memory=cuda and the same head; with --lanes too, the lane carries the calls). The draft's 5
block rows per sequence go to the server instead of the in-process head. Over a lane (docs/lane.md)
the rows and the logits stay on the draft's GPU and the call is ordered on its stream, without a
gRPC call or a host synchronisation. Without lanes each rank writes its normed rows into a
registered CUDA buffer, the server reads them over IPC, computes the fp8 head across its own GPUs
and writes the cropped bf16 logits into a second registered buffer, which is returned. Same shapes and dtype as the stock
path ([M, vocab] in the lm_head's dtype); the target's logits and every accepted token are
untouched. If the server cannot be reached the stock path serves (logged once; the server is tried
again every DRAFTHEAD_DSPARK_RETRY_S seconds, default 30).
"""
import os
import sys
import time

TARGET = os.environ.get("DRAFTHEAD_DSPARK_TARGET", "").strip()
RETRY_S = float(os.environ.get("DRAFTHEAD_DSPARK_RETRY_S", "30"))
CALL_TIMEOUT_S = float(os.environ.get("DRAFTHEAD_DSPARK_TIMEOUT_S", "2"))
MAX_M = 64


def _log(msg):
    print(f"[drafthead_dspark] {msg}", file=sys.stderr, flush=True)


class CudaRegionTransport:
    """Rows in, logits out through two CUDA regions per process (torch tensors on the draft's GPU,
    registered once by their storage's IPC handle)."""

    def __init__(self, head, hidden_size, vocab_size):
        self.head, self.k, self.vocab = head, hidden_size, vocab_size
        self._bufs = {}  # device -> (hidden tensor, logits tensor, hidden region, logits region)

    def _buffers(self, device):
        if device not in self._bufs:
            import torch
            from .regions import CudaRegion
            tag = f"dspark.{os.getpid()}.{device.index}"
            hid = torch.empty((MAX_M, self.k), dtype=torch.bfloat16, device=device)
            out = torch.empty((MAX_M, self.vocab), dtype=torch.bfloat16, device=device)
            self._bufs[device] = (hid, out, CudaRegion.from_tensor(self.head, tag + ".hid", hid),
                                  CudaRegion.from_tensor(self.head, tag + ".out", out))
        return self._bufs[device]

    def logits(self, x, out_dtype):
        import torch
        m = x.shape[0]
        hid, out, hid_r, out_r = self._buffers(x.device)
        hid[:m].copy_(x.to(torch.bfloat16))
        torch.cuda.current_stream(x.device).synchronize()  # the server reads from another process
        self.head.compute_in_regions("full", m, hid_r.slice_of(hid[:m]), logits_region=out_r.slice_of(out[:m]),
                                     timeout=CALL_TIMEOUT_S)
        return out[:m].clone().to(out_dtype)  # the buffer is reused by the next call

    def close(self):
        for _, _, a, b in self._bufs.values():
            a.close()
            b.close()
        self._bufs.clear()


class LaneTransport:
    """Rows in, logits out over the head's same-host lane (its CUDA arenas): no gRPC call, no host
    synchronisation; the logits are ordered on the caller's current stream."""

    def __init__(self, head):
        self.head = head

    def logits(self, x, out_dtype):
        import torch
        return self.head.logits(x.to(torch.bfloat16), dtype="bf16", timeout=CALL_TIMEOUT_S).to(out_dtype)

    def close(self):
        self.head.close()


class RemoteHead:
    """The server as the draft's head: connects lazily, falls back when it is unreachable."""

    def __init__(self, target, make_transport):
        self.target, self.make_transport = target, make_transport
        self.transport = None
        self.down_until = 0.0
        self.warned = False

    def _connect(self):
        from . import RemoteDraftHead
        head = RemoteDraftHead(self.target, timeout=CALL_TIMEOUT_S, attempts=1)
        info = head.info(refresh=True)
        return self.make_transport(head, info)

    def logits(self, x, out_dtype):
        """The logits, or None: the caller then takes the stock path."""
        if self.transport is None:
            if time.monotonic() < self.down_until:
                return None
            try:
                self.transport = self._connect()
            except Exception as e:  # unreachable, or not serving regions of this kind
                return self._down(e)
        try:
            return self.transport.logits(x, out_dtype)
        except Exception as e:
            self.transport = None
            return self._down(e)

    def _down(self, e):
        self.down_until = time.monotonic() + RETRY_S
        if not self.warned:
            self.warned = True
            _log(f"{self.target} unreachable ({e}); the stock head serves (retrying every {RETRY_S:g} s)")
        return None


def _check_engine(dspark_module):
    """The names the adapter needs, or RuntimeError naming the first one gone."""
    cls = getattr(dspark_module, "DeepseekV4ForCausalLMDSpark", None)
    if cls is None:
        raise RuntimeError("DRAFTHEAD_DSPARK_TARGET: DeepseekV4ForCausalLMDSpark is gone; engine drifted")
    for name in ("_logits_from_x_post_hc",):
        if not callable(getattr(cls, name, None)):
            raise RuntimeError(f"DRAFTHEAD_DSPARK_TARGET: DeepseekV4ForCausalLMDSpark.{name} is gone; engine drifted")
    if not callable(getattr(dspark_module, "gather_and_crop_vocab", None)):
        raise RuntimeError("DRAFTHEAD_DSPARK_TARGET: gather_and_crop_vocab is gone; engine drifted")
    return cls


def _torch_transport(head, info):
    # Both ways need CUDA regions (a lane's CUDA arenas are registered as such): checked first, so the
    # refusal says so even where torch is missing.
    if "CUDA_IPC" not in info.get("shared_memory", []):
        raise RuntimeError(f"the server does not serve CUDA regions (start it with --shared-memory=cuda); "
                           f"it serves {info.get('shared_memory') or 'none'}")
    import torch
    lane = head.lane(cuda_device=torch.device("cuda", torch.cuda.current_device()))
    if lane is not None and lane.cuda:
        return LaneTransport(head)
    return CudaRegionTransport(head, info["hidden_size"], info["vocab_size"])


def install(dspark_module, target=None, make_transport=None):
    """sglang.srt.models.deepseek_v4_dspark: _logits_from_x_post_hc answered by the server for up to
    MAX_M rows; everything else (and any row count or mode it does not serve) is the stock path."""
    target = TARGET if target is None else target
    if not target:
        return None
    cls = _check_engine(dspark_module)
    if getattr(cls, "_drafthead_dspark", None) is not None:
        return cls._drafthead_dspark
    remote = RemoteHead(target, make_transport or _torch_transport)
    cls._drafthead_dspark = remote
    orig_logits = cls._logits_from_x_post_hc

    def _logits_from_x_post_hc(self, x_post_hc):
        m = x_post_hc.shape[0]
        # A per-rank shard of the logits (Markov W2 sharding) is not what the server answers.
        if m == 0 or m > MAX_M or getattr(self, "_opt_markov_w2_tp_shard", False):
            return orig_logits(self, x_post_hc)
        w = getattr(self.lm_head, "weight", None)
        x = self.stages[-1].norm(x_post_hc)
        y = remote.logits(x, w.dtype if w is not None else x.dtype)
        return orig_logits(self, x_post_hc) if y is None else y

    cls._logits_from_x_post_hc = _logits_from_x_post_hc
    _log(f"armed: the draft head is served by {target}")
    return remote
