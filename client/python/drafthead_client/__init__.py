"""Python client for drafthead: a speculative-decoding draft model's LM head, served over gRPC.

    from drafthead_client import RemoteDraftHead
    head = RemoteDraftHead("127.0.0.1:50051")
    logits = head.logits(hidden)            # hidden: [..., K] numpy (uint16 bf16 bits or float32) or torch
    ids, values, probs = head.topk(hidden, k=8, probs=True)
    ids, values = head.argmax(hidden)
    ids, values = head.sample(hidden, temperature=0.8, seed=1234)

Inputs and what comes back:
- numpy uint16 (bf16 bits): logits as uint16 bf16 bits (dtype="bf16") or float32 (dtype="fp32");
- numpy float32 (or another float type, converted): logits as float32 (bf16 values widened exactly
  when dtype="bf16"); the server rounds fp32 hidden values to bf16 (round to nearest even);
- torch tensor (when torch is importable): torch tensors on the input's device, logits bf16 or fp32,
  token ids int64 (torch's index type);
- bytes-like: raw little-endian rows (bf16 unless hidden_dtype="fp32"); logits come back as bytes,
  token results as numpy.
Leading dimensions are kept: hidden [B, S, K] gives logits [B, S, V] and ids [B, S, k] ([B, S] for
argmax and sample). More rows than the server's max_rows are sent as several calls, in order.
Every call takes out= (torch's convention): your own arrays or tensors of the result's types and
element counts, filled and returned; with torch CUDA tensors over a same-host lane they are
written by the lane itself on your stream, with no torch op or allocation a call.

Errors raise DraftHeadError (a RuntimeError) carrying the gRPC status code name; an in-band error
in a response raises it too. UNAVAILABLE is retried with exponential backoff (bounded attempts),
all within the call's deadline.

AsyncRemoteDraftHead (drafthead_client.aio) has the same methods as coroutines over grpc.aio.

A caller on the server's host (a server started with --lanes) sends its calls through a same-host
lane, shared-memory rings instead of gRPC (docs/lane.md, drafthead_client.lane): lane="auto" (the
default) takes one when it can, "off" never, "required" raises when none opens. torch CUDA tensors
then stay on their GPU, ordered on the caller's stream (RemoteDraftHead; wait=False, synchronize()).

Callers on the server's host can skip the wire (servers started with --shared-memory): see
drafthead_client.regions (numpy arrays in a POSIX region, torch / cupy CUDA tensors registered by
their IPC handle) and compute_in_regions below; drafthead_client.dspark_adapter puts the DSpark
draft's head on the server through CUDA regions.

The generated stubs live in drafthead_client._gen (the build generates them into the wheel);
`pb` and `pb_grpc` name drafthead.v1's messages and service.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from typing import (Any, Callable, Dict, Generator, Iterable, Iterator, List, Literal, NamedTuple, Optional, Tuple,
                    TypeVar)

import grpc
import numpy as np

try:
    from ._gen.drafthead.v1 import drafthead_pb2 as pb
    from ._gen.drafthead.v1 import drafthead_pb2_grpc as pb_grpc
    from ._gen.drafthead_health.v1 import health_pb2, health_pb2_grpc
except ImportError as e:  # pragma: no cover - a source checkout, said plainly
    raise ImportError("drafthead_client: generated stubs not found; install the wheel the build makes "
                      "(cmake --build BUILD --target drafthead_python_wheel, docs/client.md)") from e

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover
    torch = None

from ._version import __version__
from . import native_grpc
from .lane import Lane, LaneAnswer, LaneUnavailable, _nanos

__all__ = ["RemoteDraftHead", "AsyncRemoteDraftHead", "DraftHeadError", "TopK", "Tokens", "bf16_to_float32",
           "float32_to_bf16", "DEFAULT_MAX_MESSAGE_BYTES", "pb", "pb_grpc", "__version__"]

DType = Literal["bf16", "fp32"]
HeadKind = Literal["fp8", "bf16"]
Mode = Literal["full", "topk", "argmax", "sample"]
LaneMode = Literal["auto", "off", "required"]
Transport = Literal["auto", "grpcio", "native"]
# numpy array (uint16 bf16 bits or a float type), torch tensor, or bytes-like rows.
Hidden = Any

# A full-logits answer for 64 fp32 rows of the default 129280-token vocabulary, plus headroom.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 129280 * 4 + (4 << 20)


# Client-side balancing over replicas (RemoteDraftHead(balance_replicas=True)); the C++ client's
# ClientOptions::balance_replicas sets the same.
BALANCED_SERVICE_CONFIG = json.dumps({"loadBalancingConfig": [{"round_robin": {}}],
                                      "healthCheckConfig": {"serviceName": ""}})


class DraftHeadError(RuntimeError):
    """A failed call: `code` is the gRPC status code name ("INVALID_ARGUMENT", ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TopK(NamedTuple):
    ids: Any      # [..., k] int32 (numpy) / int64 (torch), best first
    values: Any   # [..., k] float32 logits of ids
    probs: Any    # [..., k] float32 softmax(logits / T) of ids, or None


class Tokens(NamedTuple):
    ids: Any      # [...] one token per row
    values: Any   # [...] its logit


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widens bf16 bit patterns (uint16) to float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Rounds float32 to bf16 bits (uint16), to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


_DTYPES = {"bf16": pb.BF16, "fp32": pb.FP32}
_HEADS = {"fp8": pb.FP8_TWIN, "bf16": pb.BF16_EXACT}
_MODES = {"full": pb.FULL_LOGITS, "topk": pb.TOP_K, "argmax": pb.ARGMAX, "sample": pb.SAMPLE}

T = TypeVar("T")
# A call's logic without its I/O: yields each LogitsRequest, is sent its checked LogitsResponse,
# returns the result. RemoteDraftHead and AsyncRemoteDraftHead drive the same plans (_drive).
Plan = Generator[Any, Any, T]


class _Encoded(NamedTuple):
    data: bytes
    rows: int
    dtype: Any           # pb.BF16 / pb.FP32
    kind: str            # "bytes" | "numpy_bf16" | "numpy_f32" | "torch"
    lead_shape: Tuple[int, ...]  # leading dimensions of the input
    device: Any          # torch device, or None


class _HeadBase:
    """What the sync and asyncio clients share: options, retry policy, encoding, each call's plan
    (requests out, answers checked and decoded), and the same-host lane's policy (when to open
    one, when to drop it). The only I/O here is blocking: _call_blocking and _lane_open, which
    the asyncio client runs in a worker thread."""
    _info: Optional[Dict[str, Any]]  # GetModelInfo as a dict, once fetched

    def __init__(self, target: str, *, tls: bool = False, root_ca: Optional[str] = None,
                 cert: Optional[str] = None, key: Optional[str] = None, server_name: Optional[str] = None,
                 timeout: float = 30.0, attempts: int = 3, initial_backoff: float = 0.05,
                 max_backoff: float = 1.0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 balance_replicas: bool = False, lane: LaneMode = "auto", lane_depth: int = 8,
                 transport: Transport = "auto"):
        """target: ``HOST:PORT``, ``unix:PATH`` (a server started with --listen=unix:PATH; a
        caller on the server's host, so lane="auto" takes a lane when the server offers one), or any
        gRPC target. root_ca/cert/key are PEM file paths; any of them turns TLS on (cert+key: mTLS).

        balance_replicas: the target names several replicas (``dns:///drafthead-headless.NS.svc.
        cluster.local:50051``, ``ipv4:10.0.0.1:50051,10.0.0.2:50051``): calls go round robin over
        the addresses whose grpc.health.v1 Watch says SERVING, so a draining or failed replica
        leaves the rotation at once. Leave it off for one server (a NOT_SERVING server, e.g. still
        loading, would be unreachable, even for wait_until_serving).

        lane: "auto" (default) sends calls through a same-host lane (shared-memory rings,
        docs/lane.md) when the server is on this host and offers one, else over gRPC; a lane that
        breaks sends later calls over gRPC. "off": gRPC only. "required": calls raise
        DraftHeadError with the reason when no lane can be opened. lane_depth: the lane's slots
        (calls in flight on it at once).

        transport (the blocking client's ComputeLogits over gRPC; the asyncio client always uses
        grpcio): "auto" (default) makes those calls through libdrafthead_grpc.so, the system's gRPC
        C++ library on the caller's thread (80-180 us less a call than grpcio on an H100 host,
        docs/client.md), where it loads and the channel is plain (no TLS, one target), else through
        grpcio; "grpcio": always grpcio; "native": the library or a ValueError saying why not."""
        if lane not in ("auto", "off", "required"):
            raise ValueError(f"lane must be 'auto', 'off' or 'required', not {lane!r}")
        if transport not in ("auto", "grpcio", "native"):
            raise ValueError(f"transport must be 'auto', 'grpcio' or 'native', not {transport!r}")
        if bool(cert) != bool(key):
            raise ValueError("cert and key go together (mTLS needs both)")
        opts: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", max_message_bytes),
                                       ("grpc.max_send_message_length", max_message_bytes),
                                       ("grpc.enable_retries", 0)]
        if balance_replicas:
            opts.append(("grpc.service_config", BALANCED_SERVICE_CONFIG))
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        self._creds: Optional[grpc.ChannelCredentials] = None
        if tls or root_ca or cert:
            def read(p: Optional[str]) -> Optional[bytes]:
                if not p:
                    return None
                with open(p, "rb") as f:
                    return f.read()
            self._creds = grpc.ssl_channel_credentials(root_certificates=read(root_ca), private_key=read(key),
                                                       certificate_chain=read(cert))
        self._options = opts
        self._max_message_bytes = max_message_bytes
        self._native_refused = ("TLS" if self._creds is not None else
                                "balance_replicas" if balance_replicas else
                                "server_name" if server_name else "")
        self.transport: Transport = transport
        if transport == "native" and self._native_refused:
            raise ValueError(f"transport='native' takes a plain channel to one target ({self._native_refused} was given)")
        self.target = target
        self.timeout = timeout
        self.attempts = max(1, int(attempts))
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._info = None
        self.lane_mode: LaneMode = lane
        self._lane_depth = lane_depth
        self._lane: Optional[Lane] = None
        self._lane_error: Optional[DraftHeadError] = None  # why the last lane could not open (or broke)
        self._lane_retry_at = 0.0                         # no new lane before this (time.monotonic)
        self._lane_lock = threading.Lock()
        self._lane_cuda_tried = False  # a host lane was replaced (or tried to be) by one with CUDA arenas
        # The server's fair queue tells unary callers apart by connection and by this value (over
        # unix: every connection's peer reads the same): one caller per client (common/caller_header.h).
        self._caller_md = (("drafthead-caller", f"{os.getpid():x}-{random.getrandbits(48):012x}"),)
        self._open()

    def _open(self) -> None:
        """Opens the channel (each client its own kind)."""
        raise NotImplementedError

    def _blocking_channel(self) -> grpc.Channel:
        """A blocking gRPC channel to the target with the client's credentials and options."""
        if self._creds is not None:
            return grpc.secure_channel(self.target, self._creds, options=self._options)
        return grpc.insecure_channel(self.target, options=self._options)

    def _call_blocking(self, method: Callable[..., Any], request: Any, timeout: Optional[float]) -> Any:
        """One blocking call with bounded retries on UNAVAILABLE, all inside one deadline."""
        deadline = self._deadline(timeout)
        attempt = 1
        while True:
            try:
                return method(request, timeout=max(0.001, deadline - time.monotonic()), metadata=self._caller_md)
            except grpc.RpcError as e:
                time.sleep(self._retry_after(e, attempt, deadline))
                attempt += 1

    # -- the same-host lane's policy -----------------------------------------------------------------
    def _lane_wanted(self, req: Any) -> bool:
        """Whether `req` may go through a lane: the mode allows one and its rows are inline."""
        return self.lane_mode != "off" and not req.HasField("hidden_region") and not req.HasField("logits_region")

    def _lane_now(self) -> Tuple[Optional[Lane], bool]:
        """(the open lane or None, whether to try to open one now). In "required" mode, while no
        lane is open and the next try is not due, raises the last reason."""
        lane = self._lane
        if lane is not None:
            return lane, False
        if time.monotonic() < self._lane_retry_at:
            if self.lane_mode == "required" and self._lane_error is not None:
                raise self._lane_error
            return None, False
        return None, True

    def _lane_open(self, stub: Any, call: Callable[..., Any], cuda_device: Any = None) -> Optional[Lane]:
        """The open lane, opening one when due (blocking: GetModelInfo and OpenLane through `call` on
        `stub`, a blocking stub); None: calls use gRPC. A failed open is tried again after 5 s; in
        "required" mode it raises DraftHeadError with the reason. cuda_device given and the open lane
        opened without one (a host caller's first call): replaced, once, by a lane with arenas on that
        GPU, so that the order of a client's calls does not decide its way; the old lane closes when
        its last call returns (it holds no stream-ordered calls: those need the arenas)."""
        with self._lane_lock:
            lane, due = self._lane_now()
            if lane is not None and cuda_device is not None and not lane.cuda_asked and not self._lane_cuda_tried:
                self._lane_cuda_tried = True
                try:
                    self._lane = self._new_lane(stub, call, cuda_device, need_cuda=True)
                except (LaneUnavailable, DraftHeadError) as e:  # the host lane serves on, saying why
                    lane.cuda_error = f"a lane with CUDA arenas could not open: {e}"
                return self._lane
            if not due:
                return lane
            try:
                self._lane = self._new_lane(stub, call, cuda_device)
                return self._lane
            except (LaneUnavailable, DraftHeadError) as e:
                self._lane_error = DraftHeadError(e.code, f"no same-host lane: {e}")
                self._lane_retry_at = time.monotonic() + 5.0  # ask again later, not on every call
            if self.lane_mode == "required":
                raise self._lane_error
            return None

    def _new_lane(self, stub: Any, call: Callable[..., Any], cuda_device: Any, need_cuda: bool = False) -> Lane:
        """A lane opened now (GetModelInfo, then OpenLane); need_cuda: LaneUnavailable unless the
        server serves CUDA shared memory (the arenas on cuda_device need it)."""
        info = call(stub.GetModelInfo, pb.ModelInfoRequest(), 5.0)
        if need_cuda and pb.CUDA_IPC not in list(info.shared_memory):
            raise LaneUnavailable("FAILED_PRECONDITION", "the server serves no CUDA shared memory "
                                  "(--shared-memory=cuda)")
        return Lane(pb, stub, info, call, DraftHeadError, depth=self._lane_depth, cuda_device=cuda_device)

    def _lane_dropped(self, lane: Lane, e: DraftHeadError) -> bool:
        """After `lane` failed a call with `e`: True when the call should go over gRPC instead (the
        lane is gone: UNAVAILABLE in "auto" mode); then the lane is no longer the client's (a new
        one after 1 s) and the caller closes it. False: raise `e`."""
        if e.code != "UNAVAILABLE" or self.lane_mode == "required":
            return False
        with self._lane_lock:
            if self._lane is lane:
                self._lane, self._lane_retry_at = None, time.monotonic() + 1.0
                self._lane_error = e
        return True

    def _lane_timeout(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout

    def _take_lane(self) -> Optional[Lane]:
        """The open lane, no longer the client's (closing)."""
        with self._lane_lock:
            lane, self._lane = self._lane, None
        return lane

    def _retry_after(self, e: grpc.RpcError, attempt: int, deadline: float) -> float:
        """The backoff before attempt + 1 when `e` is worth retrying within the deadline; else
        raises it as a DraftHeadError."""
        code = e.code()
        if code == grpc.StatusCode.UNAVAILABLE and attempt < self.attempts:
            backoff = min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1))
            backoff *= 1 + 0.2 * (2 * random.random() - 1)
            if time.monotonic() + backoff < deadline:
                return backoff
        raise DraftHeadError(code.name, e.details() or "") from None

    def _deadline(self, timeout: Optional[float]) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    @staticmethod
    def _info_dict(m: Any) -> Dict[str, Any]:
        return {"hidden_size": m.hidden_size, "vocab_size": m.vocab_size, "padded_vocab": m.padded_vocab,
                "tp": m.tp, "shard_rows": m.shard_rows, "max_rows": m.max_rows, "max_top_k": m.max_top_k,
                "backend": m.backend, "comm": m.comm, "heads": [pb.Head.Name(h) for h in m.heads],
                "weights": m.weights, "version": m.version,
                "shared_memory": [pb.RegionKind.Name(k) for k in m.shared_memory],
                "lanes": m.lanes, "host_id": m.host_id}

    @staticmethod
    def _checked(req: Any, resp: Any) -> Any:
        """The answer to `req` (a pb.LogitsResponse, or a lane's LaneAnswer, whose in-band errors the
        lane raised already), or its in-band error raised."""
        if not isinstance(resp, LaneAnswer) and resp.HasField("error") and resp.error.code != 0:
            raise DraftHeadError(_code_name(resp.error.code), resp.error.message)
        if resp.rows != req.rows:
            raise DraftHeadError("INTERNAL", f"malformed response: {resp.rows} rows for {req.rows}")
        return resp

    # -- encoding ----------------------------------------------------------------------------------
    @staticmethod
    def _encode(hidden: Hidden, hidden_dtype: str, K: int) -> _Encoded:
        if isinstance(hidden, (bytes, bytearray, memoryview)):
            data = bytes(hidden)
            esize = 4 if hidden_dtype == "fp32" else 2
            if len(data) == 0 or len(data) % (K * esize):
                raise ValueError(f"hidden: {len(data)} bytes is not a whole number of rows of {K} x {esize} bytes")
            rows = len(data) // (K * esize)
            return _Encoded(data, rows, _DTYPES[hidden_dtype], "bytes", (rows,), None)
        if torch is not None and isinstance(hidden, torch.Tensor):
            t = hidden.detach()
            device = t.device
            if t.dtype != torch.bfloat16:
                t = t.to(torch.float32)
            t = _to_host(t)
            if t.dtype == torch.bfloat16:
                arr = t.view(torch.int16).numpy().view(np.uint16)
                dtype = pb.BF16
            else:
                arr = t.numpy()  # float32 already (converted on its device above)
                dtype = pb.FP32
            kind = "torch"
        else:
            arr = np.asarray(hidden)
            device = None
            if arr.dtype == np.uint16:
                dtype, kind = pb.BF16, "numpy_bf16"
            elif np.issubdtype(arr.dtype, np.floating):
                arr = arr.astype(np.float32, copy=False)
                dtype, kind = pb.FP32, "numpy_f32"
            else:
                raise TypeError(f"hidden: numpy dtype {arr.dtype}; want uint16 (bf16 bits) or a float type")
        if arr.ndim < 1 or arr.shape[-1] != K:
            raise ValueError(f"hidden: shape {tuple(arr.shape)}, want [..., {K}] (the server's hidden size)")
        lead = tuple(arr.shape[:-1])
        rows = math.prod(lead)  # 1 for a single row ([K])
        if rows == 0:
            raise ValueError("hidden: no rows")
        arr = np.ascontiguousarray(arr).reshape(rows, K)
        return _Encoded(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(), rows, dtype, kind,
                        lead if lead else (), device)

    @staticmethod
    def _requests(enc: _Encoded, max_rows: int, mode: Any, **fields: Any) -> Iterator[Any]:
        """The calls for `enc`, max_rows rows each."""
        chunk = max(1, max_rows)
        row_bytes = len(enc.data) // enc.rows
        for r0 in range(0, enc.rows, chunk):
            n = min(chunk, enc.rows - r0)
            yield pb.LogitsRequest(request_id=r0, rows=n, hidden=enc.data[r0 * row_bytes:(r0 + n) * row_bytes],
                                   hidden_dtype=enc.dtype, mode=mode, **fields)

    @staticmethod
    def _token_fields(mode: str, head: str, k: int, probs: bool, temperature: float, seed: int) -> Dict[str, Any]:
        """The LogitsRequest fields of a TOP_K, ARGMAX or SAMPLE call (besides rows and mode); those the
        mode does not read are 0 (proto3's unset)."""
        topk = mode == "topk"
        return {"head": _HEADS[head], "top_k": int(k) if topk else 0, "return_probs": topk and bool(probs),
                "temperature": temperature if topk or mode == "sample" else 0.0,
                "seed": int(seed) if mode == "sample" else 0}

    # -- the calls' plans --------------------------------------------------------------------------
    def _logits_plan(self, info: Dict[str, Any], hidden: Hidden, dtype: str, head: str,
                     hidden_dtype: str) -> Plan[Any]:
        enc = self._encode(hidden, hidden_dtype, info["hidden_size"])
        out_dtype = _DTYPES[dtype]
        parts, vocab = [], 0
        for req in self._requests(enc, info["max_rows"], pb.FULL_LOGITS, logits_dtype=out_dtype, head=_HEADS[head]):
            resp = yield req
            esize = 4 if out_dtype == pb.FP32 else 2
            if resp.logits_dtype != out_dtype or len(resp.logits) != req.rows * resp.vocab_size * esize:
                raise DraftHeadError("INTERNAL", "malformed response: logits size or dtype")
            vocab = resp.vocab_size
            parts.append(resp.logits)  # bytes, or a numpy uint8 array of our own (native call, lane)
        if enc.kind == "bytes":
            return b"".join(parts)
        # One call's own array (the common case) is the answer as it is; bytes (grpcio), or several
        # calls, are copied once into a new array.
        own = len(parts) == 1 and isinstance(parts[0], np.ndarray)
        flat = parts[0] if own else np.concatenate([np.frombuffer(p, dtype=np.uint8) for p in parts])
        arr = flat.view(np.float32 if out_dtype == pb.FP32 else np.uint16).reshape(enc.lead_shape + (vocab,))
        if enc.kind == "numpy_f32" and out_dtype == pb.BF16:
            return bf16_to_float32(arr)
        if enc.kind == "torch":
            return _to_device([arr], enc.device)[0]
        return arr

    def _tokens_plan(self, info: Dict[str, Any], hidden: Hidden, mode: str, hidden_dtype: str, *, head: str,
                     k: int = 1, probs: bool = False, temperature: float = 1.0,
                     seed: int = 0) -> Plan[List[Any]]:
        """TOP_K, ARGMAX or SAMPLE: [ids, values, probs or None]."""
        enc = self._encode(hidden, hidden_dtype, info["hidden_size"])
        fields = self._token_fields(mode, head, k, probs, temperature, seed)
        k = int(k) if mode == "topk" else 1
        want_probs = mode == "topk" and bool(probs)
        ids, values, prob = [], [], []
        for req in self._requests(enc, info["max_rows"], _MODES[mode], **fields):
            resp = yield req
            n = req.rows * k
            if len(resp.token_ids) != n or len(resp.values) != n or (want_probs and len(resp.probs) != n):
                raise DraftHeadError("INTERNAL", "malformed response: token_ids/values/probs sizes")
            if isinstance(resp, LaneAnswer):  # numpy arrays of its own already (Lane.compute)
                ids.append(resp.token_ids)
                values.append(resp.values)
                if want_probs:
                    prob.append(resp.probs)
                continue
            # fromiter with the count: 2-3x faster than asarray on a protobuf repeated field
            ids.append(np.fromiter(resp.token_ids, dtype=np.int32, count=n))
            values.append(np.fromiter(resp.values, dtype=np.float32, count=n))
            if want_probs:
                prob.append(np.fromiter(resp.probs, dtype=np.float32, count=n))
        shape = enc.lead_shape + ((k,) if mode == "topk" else ())

        def whole(parts: List[Any]) -> Any:  # one call's answer (the common case) is not copied again
            return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(shape)
        out = [whole(ids), whole(values), whole(prob) if want_probs else None]
        if enc.kind == "torch":
            out = _to_device([None if a is None else a.astype(np.int64) if a.dtype == np.int32 else a for a in out],
                             enc.device)
        return out

    @staticmethod
    def _regions_plan(mode: str, rows: int, hidden_region: Any, logits_region: Any, hidden_dtype: str, dtype: str,
                      k: int, probs: bool, temperature: float, seed: int, head: str) -> Plan[Any]:
        req = pb.LogitsRequest(rows=int(rows), hidden_dtype=_DTYPES[hidden_dtype], mode=_MODES[mode],
                               logits_dtype=_DTYPES[dtype], head=_HEADS[head])
        req.hidden_region.CopyFrom(hidden_region)
        if logits_region is not None:
            req.logits_region.CopyFrom(logits_region)
        if mode == "topk":
            req.top_k, req.return_probs, req.temperature = int(k), bool(probs), float(temperature)
        elif mode == "sample":
            req.temperature, req.seed = float(temperature), int(seed)
        return (yield req)


class RemoteDraftHead(_HeadBase):
    """A drafthead server as an LM head. Thread-safe (one gRPC channel, and at most one same-host
    lane, shared)."""

    def _open(self) -> None:
        self._channel = self._blocking_channel()
        self._stub = pb_grpc.DraftHeadStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        # ComputeLogits (the hot call) through the native library where chosen; the rest via grpcio.
        self._native: Optional[native_grpc.NativeChannel] = None
        self._compute_logits: Callable[..., Any] = self._stub.ComputeLogits
        self._compute_full_logits: Callable[..., Any] = self._stub.ComputeLogits
        if self.transport != "grpcio" and not self._native_refused:
            try:
                self._native = native_grpc.NativeChannel(self.target, self._max_message_bytes)
                self._compute_logits = self._native.unary("/drafthead.v1.DraftHead/ComputeLogits", pb.LogitsResponse)
                # FULL_LOGITS: the logits (field 5) copied once, into the array the caller gets.
                self._compute_full_logits = self._native.unary("/drafthead.v1.DraftHead/ComputeLogits",
                                                               pb.LogitsResponse, split_field=5)
            except OSError as e:
                if self.transport == "native":
                    raise ValueError(f"transport='native': {e}") from None
        #: which transport ComputeLogits takes: "native" or "grpcio"
        self.transport_in_use = "native" if self._native is not None else "grpcio"

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        lane = self._take_lane()
        if lane is not None:
            lane.close()
        if self._native is not None:
            self._native.close()
        self._channel.close()

    def __enter__(self) -> "RemoteDraftHead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------------------
    def _call(self, method: Callable[..., Any], request: Any, timeout: Optional[float]) -> Any:
        """One call with bounded retries on UNAVAILABLE, all inside one deadline."""
        return self._call_blocking(method, request, timeout)

    def _compute(self, req: Any, timeout: Optional[float]) -> Any:
        """Every LogitsRequest goes out here (the one request path): through the same-host lane when
        there is one, else (or, in "auto" mode, when the lane is gone) over gRPC."""
        if self._lane_wanted(req):
            lane = self.lane()
            if lane is not None:
                try:
                    return self._checked(req, lane.compute(req, self._lane_timeout(timeout)))
                except DraftHeadError as e:
                    if not self._lane_dropped(lane, e):
                        raise
                    lane.close()  # gRPC now, a new lane later
        # A forked child calls through grpcio (fork-aware); the native channel stays its parent's.
        native = self._native is not None and self._native.owned()
        if not native:
            method = self._stub.ComputeLogits
        else:
            method = self._compute_full_logits if req.mode == pb.FULL_LOGITS else self._compute_logits
        return self._checked(req, self._call(method, req, timeout))

    # -- the same-host lane --------------------------------------------------------------------------
    def lane(self, cuda_device: Any = None) -> Optional[Lane]:
        """The open same-host lane (opening it when the lane mode allows), or None: calls use gRPC.
        With lane="required", raises DraftHeadError with the reason instead of None. cuda_device: a
        lane opened now also gets arenas on that GPU (the first call with a CUDA tensor opens it so)."""
        if self.lane_mode == "off":
            return None
        return self._lane_open(self._stub, self._call, cuda_device)

    def _cuda_lane(self, hidden: Hidden) -> Optional[Lane]:
        """The lane that carries torch CUDA tensors on their GPU, when `hidden` is one and there is one."""
        if self.lane_mode == "off" or torch is None or not isinstance(hidden, torch.Tensor) or not hidden.is_cuda:
            return None
        lane = self._lane  # a lane opened for a GPU stays the client's choice: no lock to find it
        if lane is None or not lane.cuda_asked:
            lane = self.lane(cuda_device=hidden.device)
        return lane if lane is not None and lane.cuda else None

    def _lane_tensor(self, lane: Lane, hidden: Any, mode: int, wait: bool, timeout: Optional[float],
                     out: Any = None, *, logits_dtype: int = 0, top_k: int = 0, return_probs: bool = False,
                     temperature: float = 0.0, seed: int = 0, head: int = 0) -> Any:
        """hidden (a torch CUDA tensor [..., K]) through the lane's CUDA arenas, max_rows rows a call:
        the logits [..., V], or [ids, values, probs or None] ([..., k]; [...] for ARGMAX and SAMPLE),
        ordered on the caller's stream, in tensors allocated here (while the server computes the first
        chunk) or in the caller's `out` (_check_out's rules), which the lane's own C calls copy the
        answers into (each chunk of max_rows rows at its rows' offset: no slicing, no concatenation).
        Each chunk's call is a StreamPlan looked up by its shape: no keyword plumbing a call."""
        info = self._info if self._info is not None else self.info()
        K = info["hidden_size"]
        if hidden.shape[-1] != K:
            raise ValueError(f"hidden: shape {tuple(hidden.shape)}, want [..., {K}] (the server's hidden size)")
        x = hidden if hidden.dim() == 2 else hidden.reshape(-1, K)  # read by address only: no detach
        if x.dtype not in (torch.bfloat16, torch.float32):
            x = x.to(torch.float32)
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.shape[0]
        if rows == 0:
            raise ValueError("hidden: no rows")
        chunk = max(1, info["max_rows"])
        first = min(rows, chunk)
        fp32 = x.dtype == torch.float32
        timeout_ns = _nanos(timeout)
        plan = lane.stream_plan(mode, first, fp32, logits_dtype, top_k, return_probs, temperature, seed, head)
        # The first chunk is published before the answers' tensors are allocated or the caller's
        # checked (the server computes meanwhile: a torch op costs microseconds of host time), then
        # finished; a bad `out` raises once the call is finished with nothing copied.
        seq = lane.submit_plan(plan, x, timeout_ns)
        try:
            if out is None:
                out, per_row = self._new_outs(lane, hidden, mode, logits_dtype, top_k, return_probs)
            else:
                per_row = self._check_out(out, mode, rows, lane, logits_dtype=logits_dtype, top_k=top_k,
                                          return_probs=return_probs)
        except BaseException:
            try:
                lane.finish_plan(plan, seq, (), False, timeout_ns)
            except DraftHeadError:
                pass  # the caller's error goes first; a lane failure also raises at the next call
            raise
        lane.finish_plan(plan, seq, tuple(a for a, _ in per_row), wait, timeout_ns)
        for r0 in range(chunk, rows, chunk):
            n = min(chunk, rows - r0)
            lane.call_plan(lane.stream_plan(mode, n, fp32, logits_dtype, top_k, return_probs, temperature, seed, head,
                                            r0),
                           x[r0:r0 + n], tuple(a + r0 * b for a, b in per_row), wait, timeout_ns)
        return out

    def _new_outs(self, lane: Lane, hidden: Any, mode: int, logits_dtype: int, top_k: int,
                  return_probs: bool) -> Tuple[Any, List[Tuple[int, int]]]:
        """The answers' tensors of a lane call in their final shapes (and nothing else: every torch
        op costs host time), and (address, bytes a row) of each as _row_spans gives them (for token
        answers made here from the known element sizes: no torch call for them)."""
        dev, lead = lane.cuda_device, tuple(hidden.shape[:-1])
        if mode == pb.FULL_LOGITS:
            V = self.info()["vocab_size"]
            out = torch.empty(lead + (V,), dtype=torch.float32 if logits_dtype == pb.FP32 else torch.bfloat16,
                              device=dev)
            return out, _row_spans([out], V)
        k = top_k if mode == pb.TOP_K else 1
        shape = lead + ((k,) if mode == pb.TOP_K else ())
        ids = torch.empty(shape, dtype=torch.int64, device=dev)
        values = torch.empty(shape, dtype=torch.float32, device=dev)
        if not return_probs:
            return [ids, values, None], [(ids.data_ptr(), 8 * k), (values.data_ptr(), 4 * k), (0, 0)]
        probs = torch.empty(shape, dtype=torch.float32, device=dev)
        return [ids, values, probs], [(ids.data_ptr(), 8 * k), (values.data_ptr(), 4 * k), (probs.data_ptr(), 4 * k)]

    def _check_out(self, out: Any, mode: int, rows: int, lane: Lane, **fields: Any) -> List[Tuple[int, int]]:
        """The caller's output tensors for a call over the lane's CUDA arenas: contiguous torch tensors
        on the lane's GPU, the logits' dtype (bf16 / fp32) with rows x vocab_size elements, or ids
        (int64), values and probs (float32; probs exactly when asked for) with rows x k elements each,
        any shape. Returns (address, bytes a row) for each (0, 0 for no probs); ValueError naming the
        tensor otherwise."""
        if mode == pb.FULL_LOGITS:
            n = self.info()["vocab_size"]
            parts = [out]
            want = [("logits", torch.float32 if fields.get("logits_dtype") == pb.FP32 else torch.bfloat16)]
        else:
            n = fields.get("top_k", 1) if mode == pb.TOP_K else 1
            parts = _token_outs(out, bool(fields.get("return_probs")))
            want = [("ids", torch.int64), ("values", torch.float32), ("probs", torch.float32)]
        for t, (name, dtype) in zip(parts, want):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.device != lane.cuda_device or t.dtype != dtype or \
                    not t.is_contiguous() or t.numel() != rows * n:
                raise ValueError(f"out ({name}): want a contiguous {dtype} tensor of {rows} x {n} elements on "
                                 f"{lane.cuda_device}, got {_describe(t)}")
        return _row_spans(parts, n)

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Waits for every call made with wait=False (torch CUDA tensors over a lane) to be answered,
        raising the first failure among them. Without such calls, returns at once."""
        lane = self._lane
        if lane is not None:
            lane.synchronize(timeout)

    def _tokens(self, hidden: Hidden, mode: str, hidden_dtype: str, timeout: Optional[float], wait: bool, *,
                head: str, k: int = 1, probs: bool = False, temperature: float = 1.0, seed: int = 0,
                out: Any = None) -> List[Any]:
        """TOP_K, ARGMAX or SAMPLE: [ids, values, probs or None]; a torch CUDA tensor over the lane's
        CUDA arenas when there are some, else the plan. out: the caller's tensors, filled and returned."""
        lane = self._cuda_lane(hidden)
        if lane is not None:
            got = self._lane_tensor(lane, hidden, _MODES[mode], wait, timeout, out,
                                    **self._token_fields(mode, head, k, probs, temperature, seed))
            return list(got) + [None] * (3 - len(got))
        got = self._drive(self._tokens_plan(self.info(), hidden, mode, hidden_dtype, head=head, k=k, probs=probs,
                                            temperature=temperature, seed=seed), timeout)
        if out is None:
            return got
        return [None if o is None else _fill(o, r, name)
                for o, r, name in zip(_token_outs(out, got[2] is not None), got, ("ids", "values", "probs"))]

    def _drive(self, plan: Plan[T], timeout: Optional[float]) -> T:
        """Runs a plan: each request it yields goes through _compute, in order."""
        try:
            req = next(plan)
            while True:
                req = plan.send(self._compute(req, timeout))
        except StopIteration as done:
            return done.value

    def info(self, refresh: bool = False) -> Dict[str, Any]:
        """GetModelInfo as a dict (cached)."""
        if self._info is None or refresh:
            self._info = self._info_dict(self._call(self._stub.GetModelInfo, pb.ModelInfoRequest(), None))
        return self._info

    def serving(self, timeout: float = 2.0) -> bool:
        """One grpc.health.v1 check of the whole server."""
        try:
            r = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
        return r.status == health_pb2.HealthCheckResponse.SERVING

    def wait_until_serving(self, timeout: float, poll: float = 0.2) -> None:
        end = time.monotonic() + timeout
        while not self.serving(timeout=max(0.1, min(2.0, end - time.monotonic()))):
            if time.monotonic() + poll >= end:
                raise DraftHeadError("DEADLINE_EXCEEDED", f"{self.target} not SERVING within {timeout} s")
            time.sleep(poll)

    # -- public API --------------------------------------------------------------------------------
    # out= (every call below): the caller's own arrays or tensors to fill and return (torch's `out=`),
    # of the result's types and element counts (any shape, contiguous). With a torch CUDA tensor over
    # a lane's CUDA arenas they are written by the lane's own C call, ordered on the stream, with no
    # torch op and no allocation: the cheapest stream-ordered call (a scheduler's static buffers).
    def logits(self, hidden: Hidden, *, dtype: DType = "bf16", head: HeadKind = "fp8", hidden_dtype: DType = "bf16",
               timeout: Optional[float] = None, wait: bool = True, out: Any = None) -> Any:
        """Full logits [..., vocab_size] (see the module docstring for the types). wait=False: a torch
        CUDA tensor over a lane returns at once, ordered on the current stream (see synchronize)."""
        lane = self._cuda_lane(hidden)
        if lane is not None:
            return self._lane_tensor(lane, hidden, pb.FULL_LOGITS, wait, timeout, out=out,
                                     logits_dtype=_DTYPES[dtype], head=_HEADS[head])
        got = self._drive(self._logits_plan(self.info(), hidden, dtype, head, hidden_dtype), timeout)
        return got if out is None else _fill(out, got, "logits")

    def topk(self, hidden: Hidden, k: int, *, probs: bool = False, temperature: float = 1.0, head: HeadKind = "fp8",
             hidden_dtype: DType = "bf16", timeout: Optional[float] = None, wait: bool = True,
             out: Any = None) -> TopK:
        """The k largest logits per row, best first (ties to the smaller id); probs over the whole
        vocabulary. out: (ids, values) or (ids, values, probs)."""
        return TopK(*self._tokens(hidden, "topk", hidden_dtype, timeout, wait, head=head, k=k, probs=probs,
                                  temperature=temperature, out=out))

    def argmax(self, hidden: Hidden, *, head: HeadKind = "fp8", hidden_dtype: DType = "bf16",
               timeout: Optional[float] = None, wait: bool = True, out: Any = None) -> Tokens:
        """out: (ids, values)."""
        i, v, _ = self._tokens(hidden, "argmax", hidden_dtype, timeout, wait, head=head, out=out)
        return Tokens(i, v)

    def sample(self, hidden: Hidden, *, temperature: float, seed: int, head: HeadKind = "fp8",
               hidden_dtype: DType = "bf16", timeout: Optional[float] = None, wait: bool = True,
               out: Any = None) -> Tokens:
        """Gumbel-max sample per row; the draw depends only on (seed, row within the call, token id).
        out: (ids, values)."""
        i, v, _ = self._tokens(hidden, "sample", hidden_dtype, timeout, wait, head=head, temperature=temperature,
                               seed=seed, out=out)
        return Tokens(i, v)

    # -- shared-memory regions (drafthead_client.regions wraps these) --------------------------------
    def register_region(self, request: Any, timeout: Optional[float] = None) -> None:
        """RegisterRegion with a pb.RegisterRegionRequest."""
        self._call(self._stub.RegisterRegion, request, timeout)

    def unregister_region(self, name: str, timeout: Optional[float] = None) -> None:
        """UnregisterRegion; an empty name: every region."""
        self._call(self._stub.UnregisterRegion, pb.UnregisterRegionRequest(name=name), timeout)

    def compute_in_regions(self, mode: Mode, rows: int, hidden_region: Any, *, logits_region: Any = None,
                           hidden_dtype: DType = "bf16", dtype: DType = "bf16", k: int = 1,
                           probs: bool = False, temperature: float = 1.0, seed: int = 0,
                           head: HeadKind = "fp8", timeout: Optional[float] = None) -> Any:
        """One call whose hidden rows are read from `hidden_region` (a pb.RegionSlice) and, for
        mode "full", whose logits are written into `logits_region`. Returns the LogitsResponse:
        token_ids / values / probs for the other modes. The caller's writes into the hidden slice
        must be complete (a CUDA tensor: its stream synchronized) before the call."""
        return self._drive(self._regions_plan(mode, rows, hidden_region, logits_region, hidden_dtype, dtype, k,
                                              probs, temperature, seed, head), timeout)

    def stream(self, requests: Iterable[Any], timeout: Optional[float] = None) -> Iterator[Any]:
        """StreamLogits: yields one LogitsResponse per LogitsRequest, in order. In-band errors are
        yielded as responses with `error` set (the stream goes on); use pb.LogitsRequest to build."""
        try:
            for resp in self._stub.StreamLogits(iter(requests), timeout=timeout):
                yield resp
        except grpc.RpcError as e:
            raise DraftHeadError(e.code().name, e.details() or "") from None


_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


# Transfers between a GPU and the host of at least this many bytes go through pinned memory (one
# DMA, no staging through a driver buffer); smaller ones as plain torch copies. On an H100 (ABBA
# rounds, docs/NOTES.md session 19) pinned took 1.3 MB of bf16 logits from 4492 to 2932 us a call
# without MPS, and was no faster for 640 KB of rows (0.95-1.00) or small tensors (0.92-1.14).
_PINNED_MIN_BYTES = 256 * 1024


def _to_host(t: Any) -> Any:
    """A torch tensor's contiguous CPU copy, ordered like t.to("cpu") (the current stream waited
    for). From a GPU, at least _PINNED_MIN_BYTES: one copy into pinned memory on the current stream."""
    if not t.is_cuda or t.numel() * t.element_size() < _PINNED_MIN_BYTES:
        return t.to("cpu").contiguous()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host


def _to_device(arrays: List[Any], device: Any) -> List[Any]:
    """numpy answers (None kept) as torch tensors on `device`. To a GPU, at least _PINNED_MIN_BYTES
    in all: packed into one pinned buffer and copied in one transfer on the current stream (ordered
    before the caller's next work on it, as .to(device) is); less: each with .to(device)."""
    def torch_view(a: Any) -> Any:  # bf16 bits travel as uint16; torch has no uint16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
    on_gpu = device is not None and device.type == "cuda"
    if not on_gpu or sum(0 if a is None else a.nbytes for a in arrays) < _PINNED_MIN_BYTES:
        return [None if a is None else torch_view(np.ascontiguousarray(a).copy()).to(device if on_gpu else "cpu")
                for a in arrays]
    dtypes = {np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32, np.dtype(np.uint16): torch.bfloat16}
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += 0 if a is None else (a.nbytes + 7) // 8 * 8  # each piece 8-byte aligned (int64 ids)
    host = torch.empty(max(total, 8), dtype=torch.uint8, pin_memory=True)
    h = host.numpy()
    for a, o in zip(arrays, offsets):
        if a is not None:
            h[o:o + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    dev = host.to(device, non_blocking=True)
    out: List[Any] = []
    for a, o in zip(arrays, offsets):
        if a is None:
            out.append(None)
            continue
        out.append(dev[o:o + a.nbytes].view(dtypes[a.dtype]).reshape(a.shape))
    return out


def _describe(t: Any) -> str:
    if torch is not None and isinstance(t, torch.Tensor):
        return (f"a {'' if t.is_contiguous() else 'non-contiguous '}{t.dtype} tensor of {t.numel()} elements on "
                f"{t.device}")
    return type(t).__name__


def _token_outs(out: Any, probs: bool) -> List[Any]:
    """A token call's out= as [ids, values, probs or None]: (ids, values) or (ids, values, probs),
    probs exactly when the call asks for them; ValueError otherwise."""
    parts = list(out)
    if len(parts) == 2:
        parts.append(None)
    if len(parts) != 3 or (parts[2] is not None) != probs:
        raise ValueError("out: (ids, values) or (ids, values, probs), probs exactly when probs=True")
    return parts


def _row_spans(tensors: List[Any], n: int) -> List[Tuple[int, int]]:
    """(address, bytes) of one row of n elements of each tensor ((0, 0) for None): a chunk of rows
    from row r0 goes to address + r0 x bytes."""
    return [(0, 0) if t is None else (t.data_ptr(), n * t.element_size()) for t in tensors]


def _fill(out: Any, result: Any, name: str) -> Any:
    """Copies a call's result (a torch tensor or a numpy array) into the caller's `out` of the same
    element count and type (any shape); returns `out`. ValueError naming `name` otherwise."""
    if torch is not None and isinstance(result, torch.Tensor):
        if not isinstance(out, torch.Tensor) or out.numel() != result.numel() or out.dtype != result.dtype:
            raise ValueError(f"out ({name}): want a {result.dtype} tensor of {result.numel()} elements, got "
                             f"{_describe(out)}")
        out.copy_(result.reshape(out.shape))
        return out
    r = np.asarray(result)
    if not isinstance(out, np.ndarray) or out.size != r.size or out.dtype != r.dtype:
        raise ValueError(f"out ({name}): want a {r.dtype} numpy array of {r.size} elements, got "
                         f"{_describe(out) if not isinstance(out, np.ndarray) else f'a {out.dtype} array of {out.size}'}")
    np.copyto(out, r.reshape(out.shape))
    return out


def _code_name(code: int) -> str:
    return _CODE_NAMES.get(code, f"CODE_{code}")


from .aio import AsyncRemoteDraftHead  # noqa: E402  (it builds on the classes above)
