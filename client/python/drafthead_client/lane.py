"""The same-host lane from Python (docs/lane.md): requests and answers through a shared-memory ring
instead of one gRPC call each, for a caller on the server's host. RemoteDraftHead(lane="auto")
uses it by itself; this module is the mechanism.

The rings live in the native library libdrafthead_lane.so (the C ABI in client/lane/lane_c_api.h,
shipped inside the package under _native/), loaded with ctypes: no compiled Python extension, so
one build serves every CPython 3. ctypes releases the GIL while a call waits for its answer.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from typing import Any, Callable, List, NoReturn, Optional

import numpy as np

from . import _native_libs

__all__ = ["Lane", "LaneAnswer", "load_library", "local_host_id", "LaneUnavailable"]

# common/lane/lane_layout.h, field for field.
_REQUEST = struct.Struct("<QQIBBBBIIfIQIIQQIIQQ32x")
assert _REQUEST.size == 128
_COMPLETION = struct.Struct("<QQiIIIII12II")
assert _COMPLETION.size == 92
_COMPLETION_HEADER_BYTES = 512
_NO_REGION = 0xFFFFFFFF
_FLAG_PROBS, _FLAG_FENCE, _FLAG_IDS64 = 1, 2, 4
_DONE_PROBS, _DONE_IN_OUTPUT, _DONE_STEP_UNTIMED = 1, 2, 8
_LAYOUT_VERSION = 1
_ABI_VERSION = 6  # DH_LANE_ABI_VERSION (lane_c_api.h)
_NO_SLICE = (_NO_REGION, 0, 0)

_TIMING_FIELDS = ("queue_us", "compute_us", "batch_rows", "validate_us", "broadcast_us", "h2d_us", "gemv_us",
                  "epilogue_us", "gather_us", "d2h_us", "combine_us", "server_us")

_CODE_NAMES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
               5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
               9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
               13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


class LaneUnavailable(Exception):
    """No lane could be opened here (the reason is the message); `code` is the gRPC code name."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


_lib: Optional[ctypes.CDLL] = None


def load_library() -> ctypes.CDLL:
    """libdrafthead_lane.so: DRAFTHEAD_LANE_LIB when set, else the package's own copy (_native/, the
    wheel's), else a build tree's (a source checkout)."""
    global _lib
    if _lib is not None:
        return _lib
    path = _native_libs.find("libdrafthead_lane.so", "DRAFTHEAD_LANE_LIB")
    if path is None:
        raise LaneUnavailable("FAILED_PRECONDITION",
                              "libdrafthead_lane.so not found (install the wheel, or build the "
                              "drafthead_lane_c target, or set DRAFTHEAD_LANE_LIB)")
    lib = ctypes.CDLL(str(path))
    c = ctypes
    if not hasattr(lib, "dh_lane_abi_version") or lib.dh_lane_abi_version() != _ABI_VERSION:
        raise LaneUnavailable("FAILED_PRECONDITION", f"{path} is another version of libdrafthead_lane.so "
                              f"(want its C ABI version {_ABI_VERSION}): rebuild or reinstall the package")
    lib.dh_lane_layout_version.restype = c.c_uint32
    lib.dh_lane_create.restype = c.c_void_p
    lib.dh_lane_create.argtypes = [c.c_uint32, c.c_uint32, c.c_uint64, c.c_uint64, c.c_int64,
                                   c.POINTER(c.c_int), c.c_char_p, c.c_size_t]
    lib.dh_lane_destroy.argtypes = [c.c_void_p]
    for name, res in (("dh_lane_key", c.c_char_p), ("dh_lane_arena_key", c.c_char_p),
                      ("dh_lane_bytes", c.c_uint64), ("dh_lane_arena_bytes", c.c_uint64),
                      ("dh_lane_nonce", c.c_uint64), ("dh_lane_depth", c.c_uint32),
                      ("dh_lane_inline_bytes", c.c_uint32)):
        getattr(lib, name).restype = res
        getattr(lib, name).argtypes = [c.c_void_p]
    lib.dh_lane_unlink.argtypes = [c.c_void_p]
    lib.dh_lane_attach.argtypes = [c.c_void_p, c.c_int, c.c_char_p, c.c_size_t]
    for name in ("dh_lane_hidden_area", "dh_lane_output_area"):
        getattr(lib, name).restype = c.c_void_p
        getattr(lib, name).argtypes = [c.c_void_p, c.c_uint32]
    for name in ("dh_lane_hidden_offset", "dh_lane_output_offset"):
        getattr(lib, name).restype = c.c_uint64
        getattr(lib, name).argtypes = [c.c_void_p, c.c_uint32]
    lib.dh_lane_call.restype = c.c_int64
    lib.dh_lane_call.argtypes = [c.c_void_p, c.c_char_p, c.c_char_p, c.c_uint64, c.c_int64, c.c_char_p, c.c_size_t]
    lib.dh_lane_reserve.argtypes = [c.c_void_p, c.c_int64, c.POINTER(c.c_uint64), c.c_char_p, c.c_size_t]
    lib.dh_lane_publish.argtypes = [c.c_void_p, c.c_uint64, c.c_char_p]
    lib.dh_lane_wait.argtypes = [c.c_void_p, c.c_uint64, c.c_int64, c.POINTER(c.c_void_p), c.c_char_p,
                                 c.c_size_t]
    lib.dh_lane_release.argtypes = [c.c_void_p, c.c_uint64]
    lib.dh_lane_done.argtypes = [c.c_void_p, c.c_uint64]
    lib.dh_lane_completion.restype = c.c_void_p
    lib.dh_lane_completion.argtypes = [c.c_void_p, c.c_uint64]
    lib.dh_lane_cuda_attach.argtypes = [c.c_void_p, c.c_uint64, c.c_uint64, c.c_char_p, c.c_size_t]
    lib.dh_lane_call_stream.restype = c.c_int64
    lib.dh_lane_call_stream.argtypes = [c.c_void_p, c.c_char_p, c.c_uint64, c.c_uint64, c.c_void_p, c.c_int,
                                        c.c_int64, c.c_void_p, c.c_uint32, c.c_char_p, c.c_size_t]
    lib.dh_lane_submit_stream.restype = c.c_int64
    lib.dh_lane_submit_stream.argtypes = [c.c_void_p, c.c_char_p, c.c_uint64, c.c_uint64, c.c_void_p, c.c_int,
                                          c.c_int64, c.c_char_p, c.c_size_t]
    lib.dh_lane_finish_stream.argtypes = [c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint32, c.c_int, c.c_int64,
                                          c.c_char_p, c.c_size_t]
    lib.dh_lane_stream_synchronize.argtypes = [c.c_void_p, c.c_int64, c.c_char_p, c.c_size_t]
    lib.dh_lane_cuda_copy_kernel.argtypes = [c.c_void_p, c.c_int, c.c_char_p, c.c_size_t]
    lib.dh_lane_cuda_host_io.argtypes = [c.c_void_p, c.c_int, c.c_char_p, c.c_size_t]
    if lib.dh_lane_layout_version() != _LAYOUT_VERSION:
        raise LaneUnavailable("FAILED_PRECONDITION", "libdrafthead_lane.so speaks another layout version")
    _lib = lib
    return lib


def local_host_id() -> str:
    """This host's boot id (compared with ModelInfo.host_id)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@functools.lru_cache(maxsize=512)  # a caller repeats its few shapes: a lookup, not a pack, a call
def _pack(request_id: int, rows: int, hidden_dtype: int, mode: int, logits_dtype: int, head: int, top_k: int,
          return_probs: bool, temperature: float, seed: int, hidden: "tuple[int, int, int]",
          output: "tuple[int, int, int]", fence: bool = False, ids64: bool = False) -> bytes:
    """A LaneRequest (128 bytes; seq and the fence word are the library's to write). hidden / output:
    slices (region index, offset, byte_size); region _NO_REGION: none. dh_lane_call and
    dh_lane_call_stream set the hidden slice themselves and take the output slice slot-relative.
    ids64: token answers with int64 ids."""
    flags = (_FLAG_PROBS if return_probs else 0) | (_FLAG_FENCE if fence else 0) | (_FLAG_IDS64 if ids64 else 0)
    return _REQUEST.pack(0, request_id, rows, hidden_dtype, mode, logits_dtype, head, top_k, flags, temperature, 0,
                         seed, hidden[0], 0, hidden[1], hidden[2], output[0], 0, output[1], output[2])


def _round_up(v: int, to: int) -> int:
    return (v + to - 1) // to * to


class Lane:
    """One open lane: `compute(request, timeout)` answers a pb.LogitsRequest whose hidden rows are
    inline, as ComputeLogits would (an in-band error raises `error_type`). Thread-safe: up to
    `depth` calls at once, more wait for a slot."""

    def __init__(self, pb: Any, stub: Any, info: Any, call: Callable[..., Any], error_type: type,
                 depth: int = 8, spin_us: Optional[int] = None, cuda_device: Any = None):
        """cuda_device (a torch device): also give the lane arenas on that GPU, registered as CUDA
        regions, so that torch CUDA tensors go in and come out without leaving it (call_cuda).
        spin_us: how long a waiting call spins before it sleeps on the doorbell; None: when it is the
        lane's only call in flight 1.5x the recent such calls' time, within 50 us .. 2 ms, else
        200 us (docs/lane.md)."""
        if info.lanes == 0:
            raise LaneUnavailable("FAILED_PRECONDITION", "the server offers no lanes (started without --lanes)")
        if not info.host_id or info.host_id != local_host_id():
            raise LaneUnavailable("FAILED_PRECONDITION", "the server is on another host (its boot id differs)")
        if pb.SYSTEM not in list(info.shared_memory):
            raise LaneUnavailable("FAILED_PRECONDITION", "the server serves no system shared memory")
        self._pb, self._stub, self._error = pb, stub, error_type
        lib = self._lib = load_library()
        rows = info.max_rows
        self._vocab = info.vocab_size
        self._hidden_size = info.hidden_size
        self._plans: "dict[tuple[Any, ...], StreamPlan]" = {}  # stream_plan's
        self._hidden_slot = _round_up(rows * info.hidden_size * 4, 4096)
        self._output_slot = _round_up(rows * info.vocab_size * 4, 4096)
        # Token answers inline: int64 ids, values and probs (16 bytes an entry) at the largest k.
        inline = min(1 << 20, _round_up(rows * max(1, info.max_top_k) * 16, 64))
        code = ctypes.c_int(0)
        msg = ctypes.create_string_buffer(512)
        spin_ns = -1 if spin_us is None else spin_us * 1000
        self._h = lib.dh_lane_create(depth, inline, self._hidden_slot, self._output_slot, spin_ns,
                                     ctypes.byref(code), msg, len(msg))
        if not self._h:
            raise LaneUnavailable(_CODE_NAMES.get(code.value, "UNKNOWN"), msg.value.decode(errors="replace"))
        self._depth = lib.dh_lane_depth(self._h)
        self._inline = lib.dh_lane_inline_bytes(self._h)
        nonce = lib.dh_lane_nonce(self._h)
        req = pb.OpenLaneRequest(shm_key=lib.dh_lane_key(self._h).decode(), byte_size=lib.dh_lane_bytes(self._h),
                                 nonce=nonce, layout_version=_LAYOUT_VERSION, pid=os.getpid())
        req.regions.add(name=f"lane-arena-{os.getpid()}-{nonce}", kind=pb.SYSTEM,
                        shm_key=lib.dh_lane_arena_key(self._h).decode(), byte_size=lib.dh_lane_arena_bytes(self._h))
        self._cuda_hidden: Any = None  # torch uint8 tensors on cuda_device, or None
        self._cuda_output: Any = None
        #: whether this lane was opened with a CUDA device (its arenas asked for, given or not)
        self.cuda_asked: bool = cuda_device is not None
        self.cuda_error: Optional[str] = "no CUDA device asked for"
        if cuda_device is not None:
            if pb.CUDA_IPC not in list(info.shared_memory):
                self.cuda_error = "the server serves no CUDA shared memory (--shared-memory=cuda)"
            else:
                import torch
                from .regions import tensor_region_request
                # Arenas on the caller's GPU: rows in (fp32 at most), answers out (fp32 logits at most).
                self._cuda_hidden = torch.empty(self._depth * self._hidden_slot, dtype=torch.uint8, device=cuda_device)
                self._cuda_output = torch.empty(self._depth * self._output_slot, dtype=torch.uint8, device=cuda_device)
                req.regions.append(tensor_region_request(f"lane-cuda-in-{os.getpid()}-{nonce}", self._cuda_hidden))
                req.regions.append(tensor_region_request(f"lane-cuda-out-{os.getpid()}-{nonce}", self._cuda_output))
        self.lane_id: int = 0
        try:
            resp = call(stub.OpenLane, req, 10.0)
        except Exception as e:  # the server's reason, as the caller's error type carries it
            lib.dh_lane_destroy(self._h)
            self._h = None
            raise LaneUnavailable(getattr(e, "code", "UNKNOWN"), f"OpenLane: {e}") from None
        finally:
            if self._h:
                lib.dh_lane_unlink(self._h)
        self.lane_id = resp.lane_id
        rc = lib.dh_lane_attach(self._h, resp.server_pid, msg, len(msg))
        if rc != 0:
            self.close()
            raise LaneUnavailable(_CODE_NAMES.get(rc, "UNKNOWN"), msg.value.decode(errors="replace"))
        self._call = call
        self._tls = threading.local()  # each thread's message buffer for the library's errors
        # Views of each slot's completion (header, then the inline answer) and output area, made
        # once here: a call reads its answer through them (copying it out) before releasing the slot.
        cbytes = _COMPLETION_HEADER_BYTES + self._inline
        self._completions: List[memoryview] = []
        self._inline_words: List[Any] = []   # numpy <u4 over each slot's inline answer
        self._outputs: List[memoryview] = []
        self._output_words: List[Any] = []   # numpy <u4 over each slot's output area
        for slot in range(self._depth):
            done = memoryview((ctypes.c_char * cbytes).from_address(lib.dh_lane_completion(self._h, slot))).cast("B")
            self._completions.append(done)
            self._inline_words.append(np.frombuffer(done, dtype="<u4", offset=_COMPLETION_HEADER_BYTES))
            out = memoryview((ctypes.c_char * self._output_slot).from_address(lib.dh_lane_output_area(self._h, slot)))
            self._outputs.append(out.cast("B"))
            self._output_words.append(np.frombuffer(self._outputs[-1], dtype="<u4"))
        self._torch: Any = None
        self._cuda_device: Any = None
        self._cuda_index = 0
        self._stream: Any = None          # device index -> the current CUstream handle (an int)
        if self._cuda_hidden is not None:
            rc = lib.dh_lane_cuda_attach(self._h, self._cuda_hidden.data_ptr(), self._cuda_output.data_ptr(), msg,
                                         len(msg))
            self.cuda_error = None if rc == 0 else msg.value.decode(errors="replace")
            if rc != 0:
                self._cuda_hidden = self._cuda_output = None
            else:
                import torch
                self._torch = torch
                self._cuda_device = self._cuda_output.device
                self._cuda_index = self._cuda_device.index
                # The raw handle without a torch.cuda.Stream object per call (torch's own fast path;
                # the public one where a torch lacks it).
                raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
                self._stream = raw if raw is not None else (
                    lambda index: torch.cuda.current_stream(index).cuda_stream)

    @property
    def cuda_device(self) -> Any:
        """The torch device of the lane's CUDA arenas (None without them)."""
        return self._cuda_device

    @property
    def cuda(self) -> bool:
        """Whether torch CUDA tensors travel this lane on their GPU (call_cuda)."""
        return self._cuda_hidden is not None

    def copy_kernel(self, use: Optional[bool] = None) -> "tuple[bool, str]":
        """The library's copy kernel for call_cuda (a call's rows and fence in one launch, its answer
        and consumed word in another, instead of two libcuda calls each; on by default wherever it
        loaded, docs/lane.md): use=True / False turns it on / off, None asks. Returns (in use, why it
        is not loaded: "" when it is)."""
        return self._cuda_switch(self._lib.dh_lane_cuda_copy_kernel, use)

    def host_io(self, use: Optional[bool] = None) -> "tuple[bool, str]":
        """Host IO for call_cuda: the rows cross into the lane's host arena and a token answer comes
        back inline in the completion, both by the caller's own GPU work, so the server touches only
        host memory (docs/lane.md); FULL_LOGITS keeps the CUDA arenas. On by default wherever the
        library registered the host arena. use=True / False turns it on / off, None asks. Returns
        (in use, why it is not available: "" when it is)."""
        return self._cuda_switch(self._lib.dh_lane_cuda_host_io, use)

    def _cuda_switch(self, entry: Any, use: Optional[bool]) -> "tuple[bool, str]":
        """One of the library's switches of stream-ordered calls: (in use, why it is not available)."""
        if self._h is None or not self.cuda:
            return False, "no CUDA arenas on this lane"
        msg = self._msg()
        on = entry(self._h, -1 if use is None else int(bool(use)), msg, len(msg))
        return bool(on), msg.value.decode(errors="replace")

    def close(self) -> None:
        """CloseLane (bounded, best effort: the server also frees a lane whose caller exits)."""
        h, self._h = self._h, None
        if h is None:
            return
        if self.lane_id:
            try:
                self._stub.CloseLane(self._pb.CloseLaneRequest(lane_id=self.lane_id), timeout=2.0)
            except Exception:
                pass
        self._lib.dh_lane_destroy(h)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    def _raise(self, code: int, msg: Any) -> NoReturn:
        text = msg.value.decode(errors="replace") if hasattr(msg, "value") else str(msg)
        raise self._error(_CODE_NAMES.get(code, "UNKNOWN"), text)

    def _msg(self) -> Any:
        """This thread's buffer for the library's error messages."""
        msg = getattr(self._tls, "msg", None)
        if msg is None:
            msg = self._tls.msg = ctypes.create_string_buffer(512)
        return msg

    def _copies(self) -> Any:
        """This thread's array of copy-out triples for dh_lane_call_stream."""
        c = getattr(self._tls, "copies", None)
        if c is None:
            c = self._tls.copies = (ctypes.c_uint64 * 12)()
        return c

    def synchronize(self, timeout: Optional[float] = None) -> None:
        """Waits (on the host) for every stream-ordered call's answer; raises the first failure."""
        h = self._h
        if h is None:
            return
        msg = self._msg()
        rc = self._lib.dh_lane_stream_synchronize(h, _nanos(timeout), msg, len(msg))
        if rc != 0:
            self._raise(rc, msg)

    def stream_plan(self, mode: int, rows: int, fp32_rows: bool, logits_dtype: int = 0, top_k: int = 0,
                    return_probs: bool = False, temperature: float = 0.0, seed: int = 0, head: int = 0,
                    request_id: int = 0) -> "StreamPlan":
        """The fixed parts of a stream-ordered call of this shape (made once, then looked up: a
        caller repeats its few shapes)."""
        key = (mode, rows, fp32_rows, logits_dtype, top_k, return_probs, temperature, seed, head, request_id)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 1024:  # bounded: a caller varying temperature or seed makes new keys
                self._plans.clear()
            plan = self._plans[key] = StreamPlan(self, *key)
        return plan

    def call_cuda(self, *, mode: int, x: Any, out_ptrs: "tuple[int, ...]", logits_dtype: int = 0, top_k: int = 0,
                  return_probs: bool = False, temperature: float = 0.0, seed: int = 0, head: int = 0,
                  request_id: int = 0, wait: bool = True, timeout: Optional[float] = None) -> None:
        """One call with a torch CUDA tensor x [rows, K] (bf16 or fp32, contiguous, at most max_rows
        rows; on another GPU than the lane's arenas it is copied there first) on the current stream of
        the arenas' device, in one C call and no torch op: the library copies the rows into the lane's
        CUDA arena, fences them, makes the stream wait for the answer and copies it to out_ptrs (device
        addresses on the arenas' GPU: the logits [rows, V], or ids (int64, the server writes them so),
        values and probs (0 without), [rows, k] each), all ordered on the stream. wait=True also waits
        on the host (for this call and the earlier ones) and raises a failure at once; wait=False
        returns at once, and a failure raises at the next call or synchronize() (like an asynchronous
        CUDA error)."""
        plan = self._checked_plan(x, mode, logits_dtype, top_k, return_probs, temperature, seed, head, request_id)
        self.call_plan(plan, x, out_ptrs, wait, _nanos(timeout))

    def submit_cuda(self, *, mode: int, x: Any, logits_dtype: int = 0, top_k: int = 0, return_probs: bool = False,
                    temperature: float = 0.0, seed: int = 0, head: int = 0, request_id: int = 0,
                    timeout: Optional[float] = None) -> int:
        """call_cuda's first half (dh_lane_submit_stream): the rows copied, fenced and published on the
        current stream, so that the server computes while the caller allocates the answer's tensors.
        Returns the call's seq, which finish_cuda must take next, from this thread (with no out_ptrs
        when the caller gave up in between)."""
        plan = self._checked_plan(x, mode, logits_dtype, top_k, return_probs, temperature, seed, head, request_id)
        return self.submit_plan(plan, x, _nanos(timeout))

    def finish_cuda(self, seq: int, *, mode: int, rows: int, out_ptrs: "tuple[int, ...]" = (), logits_dtype: int = 0,
                    top_k: int = 0, return_probs: bool = False, wait: bool = True, timeout: Optional[float] = None,
                    **_: Any) -> None:
        """call_cuda's second half (dh_lane_finish_stream) for submit_cuda's seq: the stream waits for
        the answer and copies it to out_ptrs (call_cuda's), as call_cuda does; () copies nothing."""
        plan = self.stream_plan(mode, rows, False, logits_dtype, top_k, return_probs)  # the pieces only
        self.finish_plan(plan, seq, out_ptrs, wait, _nanos(timeout))

    def _checked_plan(self, x: Any, mode: int, *fields: Any) -> "StreamPlan":
        """The plan of a call with rows x, which must be a contiguous bf16 or fp32 tensor [rows, K]
        (ValueError otherwise: the library copies the plan's bytes from its address)."""
        torch = self._torch
        if x.dtype not in (torch.bfloat16, torch.float32) or x.dim() != 2 or x.shape[1] != self._hidden_size or \
                not x.is_contiguous():
            raise ValueError(f"x: want a contiguous bf16 or fp32 tensor [rows, {self._hidden_size}], got "
                             f"{x.dtype} {tuple(x.shape)}")
        return self.stream_plan(mode, x.shape[0], x.dtype == torch.float32, *fields)

    # The same three on a StreamPlan, with timeouts in ns (-1: none): what the client's torch path
    # calls, with no keyword plumbing a call.
    def submit_plan(self, plan: "StreamPlan", x: Any, timeout_ns: int) -> int:
        h = self._h
        if h is None:
            raise self._error("UNAVAILABLE", "the lane is closed")
        if x.device != self._cuda_device:
            x = x.to(self._cuda_device)
        msg = self._msg()
        n = self._lib.dh_lane_submit_stream(h, plan.desc, x.data_ptr(), plan.hidden_bytes,
                                            self._stream(self._cuda_index), 1, timeout_ns, msg, len(msg))
        if n < 0:
            self._raise(-n, msg)
        return n

    def finish_plan(self, plan: "StreamPlan", seq: int, out_ptrs: "tuple[int, ...]", wait: bool,
                    timeout_ns: int) -> None:
        h = self._h
        if h is None:  # closed meanwhile: the call went with the lane
            raise self._error("UNAVAILABLE", "the lane is closed")
        copies, n_copies = plan.copies(self._copies(), out_ptrs)
        msg = self._msg()
        rc = self._lib.dh_lane_finish_stream(h, seq, copies, n_copies, 1 if wait else 0, timeout_ns, msg, len(msg))
        if rc != 0:
            self._raise(rc, msg)

    def call_plan(self, plan: "StreamPlan", x: Any, out_ptrs: "tuple[int, ...]", wait: bool, timeout_ns: int) -> None:
        h = self._h
        if h is None:
            raise self._error("UNAVAILABLE", "the lane is closed")
        if x.device != self._cuda_device:
            x = x.to(self._cuda_device)
        copies, n_copies = plan.copies(self._copies(), out_ptrs)
        msg = self._msg()
        n = self._lib.dh_lane_call_stream(h, plan.desc, x.data_ptr(), plan.hidden_bytes,
                                          self._stream(self._cuda_index), 1 if wait else 0, timeout_ns, copies,
                                          n_copies, msg, len(msg))
        if n < 0:
            self._raise(-n, msg)

    def compute(self, req: Any, timeout: Optional[float]) -> "LaneAnswer":
        """One call: `req` (a pb.LogitsRequest, rows inline) through the lane, waiting up to `timeout`
        seconds (None: no limit); returns its LaneAnswer (an in-band error raises). One C call
        (reserve, copy the rows, publish, wait), the answer copied out of the slot, the slot's release."""
        pb, lib, h = self._pb, self._lib, self._h
        if h is None:
            raise self._error("UNAVAILABLE", "the lane is closed")
        full = req.mode == pb.FULL_LOGITS
        logits_bytes = 0
        out = _NO_SLICE
        if full:
            logits_bytes = min(self._output_slot, req.rows * self._vocab * (4 if req.logits_dtype == pb.FP32 else 2))
            out = (0, 0, logits_bytes)  # the slot's output area
        d = _pack(req.request_id, req.rows, req.hidden_dtype, req.mode, req.logits_dtype, req.head, req.top_k,
                  req.return_probs, req.temperature, req.seed, _NO_SLICE, out)
        hidden = req.hidden
        msg = self._msg()
        n = lib.dh_lane_call(h, d, hidden, len(hidden), _nanos(timeout), msg, len(msg))
        if n < 0:
            self._raise(-n, msg)
        slot = n % self._depth
        try:
            done = self._completions[slot]
            fields = _COMPLETION.unpack_from(done)
            code, rows, k, flags = fields[2], fields[3], fields[5], fields[6]
            if code != 0:
                mlen = min(fields[20], 384)
                raise self._error(_CODE_NAMES.get(code, "UNKNOWN"), bytes(done[92:92 + mlen]).decode(errors="replace"))
            a = LaneAnswer(fields)
            if full:
                # One copy out of the slot, into the array the caller gets (the plan keeps it).
                a.logits = np.frombuffer(self._outputs[slot], dtype=np.uint8, count=logits_bytes).copy()
            elif rows:
                entries = rows * k
                probs = bool(flags & _DONE_PROBS)
                words = self._output_words[slot] if flags & _DONE_IN_OUTPUT else self._inline_words[slot]
                if entries * (3 if probs else 2) > len(words):
                    raise self._error("INTERNAL", "the lane's answer is larger than its slot")
                # One copy out of the slot (it is reused once released), then views of it.
                answer = words[:entries * (3 if probs else 2)].copy()
                a.token_ids = answer[:entries].view("<i4")
                a.values = answer[entries:2 * entries].view("<f4")
                if probs:
                    a.probs = answer[2 * entries:].view("<f4")
            return a
        finally:
            lib.dh_lane_release(h, n)


_EMPTY_I4 = np.zeros(0, dtype="<i4")
_EMPTY_F4 = np.zeros(0, dtype="<f4")


def _nanos(timeout: Optional[float]) -> int:
    """A timeout in seconds (None: none) as the library's nanoseconds (-1: none)."""
    return -1 if timeout is None else max(0, int(timeout * 1e9))


class StreamPlan:
    """A stream-ordered call's fixed parts for one request shape (Lane.stream_plan): its LaneRequest
    (fenced rows, the answer in the slot's output area; the library writes seq and the slots), its
    rows' bytes, and the (offset, bytes) in the slot's answer of each of its answer's pieces: the
    logits, or ids (int64), values and probs (None without)."""

    __slots__ = ("desc", "hidden_bytes", "pieces")

    def __init__(self, lane: "Lane", mode: int, rows: int, fp32_rows: bool, logits_dtype: int, top_k: int,
                 return_probs: bool, temperature: float, seed: int, head: int, request_id: int):
        pb = lane._pb
        if mode == pb.FULL_LOGITS:
            self.pieces: "tuple[Optional[tuple[int, int]], ...]" = (
                (0, rows * lane._vocab * (4 if logits_dtype == pb.FP32 else 2)),)
        else:
            m = rows * (top_k if mode == pb.TOP_K else 1)
            self.pieces = ((0, 8 * m), (8 * m, 4 * m), (12 * m, 4 * m) if return_probs else None)
        out_bytes = sum(p[1] for p in self.pieces if p is not None)  # the answer: its pieces back to back
        self.hidden_bytes = rows * lane._hidden_size * (4 if fp32_rows else 2)
        self.desc = _pack(request_id, rows, pb.FP32 if fp32_rows else pb.BF16, mode, logits_dtype, head, top_k,
                          return_probs, temperature, seed, _NO_SLICE, (2, 0, out_bytes), fence=True,
                          ids64=mode != pb.FULL_LOGITS)

    def copies(self, array: Any, out_ptrs: "tuple[int, ...]") -> "tuple[Any, int]":
        """The library's (destination, offset, bytes) triples for out_ptrs (one address a piece; 0 or
        missing: that piece is not copied) in `array`; (array, their count)."""
        n = 0
        for dst, piece in zip(out_ptrs, self.pieces):
            if dst and piece is not None:
                array[3 * n:3 * n + 3] = (dst, piece[0], piece[1])
                n += 1
        return array, n


class LaneAnswer:
    """A lane call's answer, read like the pb.LogitsResponse gRPC returns (the fields the client's
    plans read: rows, vocab_size, logits_dtype, logits, token_ids, values, probs, timing) but held
    as numpy arrays: building a protobuf message per call cost ~8 us of the ~50 us a Python lane
    call took. An answer that arrives is never an error (Lane.compute raises those)."""

    __slots__ = ("request_id", "rows", "vocab_size", "logits_dtype", "logits", "token_ids", "values", "probs",
                 "_timing", "_step_untimed")

    def __init__(self, fields: "tuple[Any, ...]"):
        self.request_id, _, self.rows, self.vocab_size, _, _, self.logits_dtype = fields[1:8]
        self._timing = fields[8:20]
        self._step_untimed = bool(fields[6] & _DONE_STEP_UNTIMED)
        self.logits: Any = b""  # FULL_LOGITS: a numpy uint8 array (Lane.compute)
        self.token_ids: Any = _EMPTY_I4
        self.values: Any = _EMPTY_F4
        self.probs: Any = _EMPTY_F4

    @property
    def timing(self) -> "dict[str, int]":
        """The server's Timing fields (pb.Timing's names): microseconds, and step_untimed (the batch's
        h2d_us .. d2h_us not measured, 0)."""
        timing: "dict[str, int]" = dict(zip(_TIMING_FIELDS, self._timing))
        timing["step_untimed"] = self._step_untimed
        return timing
