"""The native unary call (libdrafthead_grpc.so, client/native_grpc/unary_c_api.h): ComputeLogits on
the caller's thread through the system's gRPC C++ library instead of grpcio's Python layers: 80-180
us less a call on an H100 host (docs/client.md).
Bytes in, bytes out: the request is serialized here and the answer parsed here, so the client sees
the same messages and the same errors (NativeRpcError is a grpc.RpcError with code() and
details()) either way; one large bytes field of the answer may come apart, straight into a numpy
array (unary's split_field). Insecure channels only; where the library or the system's gRPC C++
library is missing, load_library says why and the client keeps grpcio."""
import ctypes
import os
import threading
from typing import Any, Callable, Optional, Sequence, Tuple

import grpc
import numpy as np

from . import _native_libs

_ABI_VERSION = 3
_WAIT_SLICE_NS = 200_000_000  # signals (Ctrl-C) are seen between slices, as with grpcio
_lib: Optional[ctypes.CDLL] = None
_why_not = ""
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class NativeRpcError(grpc.RpcError):
    """A failed native call, shaped like grpcio's errors (code(), details())."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def load_library() -> Tuple[Optional[ctypes.CDLL], str]:
    """(the library, "") or (None, why not): DRAFTHEAD_GRPC_LIB when set, else the package's own copy
    (_native/, the wheel's), else a build tree's (a source checkout)."""
    global _lib, _why_not
    if _lib is not None or _why_not:
        return _lib, _why_not
    path = _native_libs.find("libdrafthead_grpc.so", "DRAFTHEAD_GRPC_LIB")
    if path is None:
        _why_not = "libdrafthead_grpc.so not found (the wheel carries it where it was built with gRPC C++)"
        return None, _why_not
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # typically: the system's gRPC C++ library is not installed
        _why_not = f"{path} does not load: {e}"
        return None, _why_not
    if not hasattr(lib, "dh_grpc_abi_version") or lib.dh_grpc_abi_version() != _ABI_VERSION:
        _why_not = f"{path} is another version of libdrafthead_grpc.so (want its C ABI {_ABI_VERSION})"
        return None, _why_not
    c = ctypes
    lib.dh_grpc_open.restype = c.c_void_p
    lib.dh_grpc_open.argtypes = [c.c_char_p, c.c_int64, c.c_char_p, c.c_size_t]
    lib.dh_grpc_shutdown.argtypes = [c.c_void_p]
    lib.dh_grpc_close.argtypes = [c.c_void_p]
    lib.dh_grpc_start.restype = c.c_void_p
    lib.dh_grpc_start.argtypes = [c.c_void_p, c.c_char_p, c.c_char_p, c.c_size_t, c.c_int64, c.c_char_p,
                                  c.c_char_p]
    lib.dh_grpc_wait.argtypes = [c.c_void_p, c.c_int64]
    lib.dh_grpc_cancel.argtypes = [c.c_void_p]
    lib.dh_grpc_finish.argtypes = [c.c_void_p, c.POINTER(c.c_void_p), c.POINTER(c.c_size_t), c.c_char_p,
                                   c.c_size_t]
    lib.dh_grpc_free.argtypes = [c.c_void_p]
    lib.dh_grpc_answer_field_bytes.restype = c.c_int64
    lib.dh_grpc_answer_field_bytes.argtypes = [c.c_void_p, c.c_int]
    lib.dh_grpc_finish_split.argtypes = [c.c_void_p, c.c_int, c.c_void_p, c.c_size_t, c.POINTER(c.c_void_p),
                                         c.POINTER(c.c_size_t), c.c_char_p, c.c_size_t]
    _lib = lib
    return lib, ""


class SplitAnswer:
    """An answer whose field `name` came apart (NativeChannel.unary's split_field): that attribute is
    a numpy uint8 array of the field's bytes (empty when absent), every other attribute the message's."""

    __slots__ = ("_message", "_name", "_field")

    def __init__(self, message: Any, name: str, field: Any):
        self._message, self._name, self._field = message, name, field

    def __getattr__(self, attr: str) -> Any:
        if attr == self._name:
            return self._field
        return getattr(self._message, attr)


class NativeChannel:
    """An insecure channel of libdrafthead_grpc.so. unary() gives a callable shaped like a grpcio
    stub method: fn(request, timeout=None, metadata=()) -> the parsed answer. Thread-safe; close()
    from any thread cancels the calls running (CANCELLED), as closing a grpcio channel does.
    Only the opening process may use it (`owned()`): a forked child shares its connection's socket,
    and a call from there would corrupt the parent's HTTP/2 stream (seen: the parent's next call
    then ran into its deadline); a child's close() leaves it alone."""

    def __init__(self, target: str, max_message_bytes: int):
        lib, why = load_library()
        if lib is None:
            raise OSError(why)
        msg = ctypes.create_string_buffer(512)
        h = lib.dh_grpc_open(target.encode(), int(max_message_bytes), msg, len(msg))
        if not h:
            raise OSError(f"libdrafthead_grpc.so: {msg.value.decode(errors='replace')}")
        self._lib, self._h = lib, h
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._running = 0  # calls inside the library (the handle is freed only when none is)

    def unary(self, method: str, response_type: Any, split_field: Optional[int] = None) -> Callable[..., Any]:
        """split_field: the number of a top-level bytes field of response_type that comes apart, copied
        once into a new writable numpy uint8 array instead of through the message (the answer is then
        a SplitAnswer: that field the array, the rest the message's)."""
        lib, name = self._lib, method.encode()
        c = ctypes
        split_name = response_type.DESCRIPTOR.fields_by_number[split_field].name if split_field else ""

        def call(request: Any, timeout: Optional[float] = None, metadata: Sequence[Tuple[str, str]] = ()) -> Any:
            if len(metadata) > 1:
                raise ValueError("the native call carries one metadata pair at most")
            data = request.SerializeToString()
            key, value = (metadata[0][0].encode(), metadata[0][1].encode()) if metadata else (None, None)
            out, n, msg = c.c_void_p(), c.c_size_t(), c.create_string_buffer(512)
            timeout_ns = int((timeout if timeout is not None else 3600.0) * 1e9)
            if not self.owned():
                raise NativeRpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                     "the native channel belongs to the process that opened it (this one forked)")
            with self._cond:
                h = self._h
                if h is None:
                    raise NativeRpcError(grpc.StatusCode.CANCELLED, "the channel is closed")
                self._running += 1
            try:
                call_h = lib.dh_grpc_start(h, name, data, len(data), timeout_ns, key, value)
                try:
                    while not lib.dh_grpc_wait(call_h, _WAIT_SLICE_NS):
                        pass
                except BaseException:  # KeyboardInterrupt between slices: end the call, then raise
                    lib.dh_grpc_cancel(call_h)
                    lib.dh_grpc_finish(call_h, c.byref(out), c.byref(n), msg, len(msg))
                    lib.dh_grpc_free(out)
                    raise
                field = None
                if split_field:
                    size = lib.dh_grpc_answer_field_bytes(call_h, split_field)
                    try:
                        field = np.empty(max(size, 0), dtype=np.uint8)
                    except BaseException:  # MemoryError: the call is still freed
                        lib.dh_grpc_finish(call_h, c.byref(out), c.byref(n), msg, len(msg))
                        lib.dh_grpc_free(out)
                        raise
                    code = lib.dh_grpc_finish_split(call_h, split_field, field.ctypes.data, field.nbytes,
                                                    c.byref(out), c.byref(n), msg, len(msg))
                else:
                    code = lib.dh_grpc_finish(call_h, c.byref(out), c.byref(n), msg, len(msg))
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()
            if code != 0:
                raise NativeRpcError(_CODES.get(code, grpc.StatusCode.UNKNOWN), msg.value.decode(errors="replace"))
            try:
                message = response_type.FromString(c.string_at(out, n.value) if out.value else b"")
            finally:
                lib.dh_grpc_free(out)
            return message if field is None else SplitAnswer(message, split_name, field)

        return call

    def owned(self) -> bool:
        """Whether this process opened the channel (False in a forked child)."""
        return os.getpid() == self._pid

    def close(self) -> None:
        if not self.owned():
            self._h = None  # the parent's: not this process's to shut
            return
        with self._cond:
            h, self._h = self._h, None
            if h is None:
                return
            self._lib.dh_grpc_shutdown(h)  # the running calls end now, CANCELLED
            if not self._cond.wait_for(lambda: self._running == 0, timeout=10.0):
                return  # a call still inside the library: leave the handle rather than free it under it
        self._lib.dh_grpc_close(h)
