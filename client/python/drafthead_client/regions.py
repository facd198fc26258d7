"""Shared-memory regions from Python: hidden rows and logits that skip the wire (servers started
with --shared-memory). docs/shared-memory.md says when to use which and what to keep alive.

    from drafthead_client import RemoteDraftHead
    from drafthead_client.regions import SystemRegion, CudaRegion

    head = RemoteDraftHead("127.0.0.1:50051")
    with SystemRegion(head, "sched0", 1 << 22) as r:           # POSIX shared memory, numpy views
        x = r.ndarray((5, K), np.uint16)                       # bf16 bits, written in place
        y = r.ndarray((5, V), np.uint16, offset=x.nbytes)
        x[:] = bits
        head.compute_in_regions("full", 5, r.slice_of(x), logits_region=r.slice_of(y))
        # y now holds the logits

    hid = CudaRegion.from_tensor(head, "hid", torch.empty(64, K, dtype=torch.bfloat16, device="cuda"))
    # hid.slice_of(view) names any contiguous view of the registered tensor

A region object owns its registration: close() (or leaving the `with`) unregisters it, and after
that the server never touches the memory. Keep the memory alive (SystemRegion owns its own; for
CudaRegion, the tensor it holds) until then. CUDA tensors: synchronize the stream that wrote the
hidden rows before the call (the server reads them from another process); the logits are complete
when the call returns.
"""

from __future__ import annotations

import ctypes
import os
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any, Tuple, TypeVar, Union

import numpy as np

from . import DraftHeadError, pb

if TYPE_CHECKING:
    from . import RemoteDraftHead

__all__ = ["SystemRegion", "CudaRegion"]

R = TypeVar("R", bound="_Region")


class _Region:
    """A registered region: its name and slices of it (pb.RegionSlice) for requests."""

    def __init__(self, head: "RemoteDraftHead", name: str, nbytes: int):
        self.head, self.name, self.nbytes = head, name, int(nbytes)
        self._registered = False

    def _register(self, request: Any) -> None:
        self.head.register_region(request)
        self._registered = True

    def slice(self, offset: int, nbytes: int) -> Any:
        """[offset, offset + nbytes) of the region."""
        if offset < 0 or nbytes <= 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"slice [{offset}, +{nbytes}) is outside region '{self.name}' ({self.nbytes} bytes)")
        return pb.RegionSlice(region=self.name, offset=int(offset), byte_size=int(nbytes))

    def close(self) -> None:
        """Unregisters (once); the server never touches the memory after this returns."""
        if self._registered:
            self._registered = False
            self.head.unregister_region(self.name)

    def __enter__(self: R) -> R:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class SystemRegion(_Region):
    """A POSIX shared-memory object created by this process, registered as a SYSTEM region.
    ndarray() gives numpy views of it; close() unregisters, then releases and unlinks it."""

    def __init__(self, head: "RemoteDraftHead", name: str, nbytes: int):
        super().__init__(head, name, nbytes)
        self._shm = shared_memory.SharedMemory(create=True, size=int(nbytes))
        self.key = "/" + self._shm.name.lstrip("/")
        try:
            self._register(pb.RegisterRegionRequest(name=name, kind=pb.SYSTEM, shm_key=self.key,
                                                    byte_size=int(nbytes)))
        except BaseException:
            self._release()
            raise

    @property
    def buf(self) -> memoryview:
        return self._shm.buf

    def ndarray(self, shape: Union[int, Tuple[int, ...]], dtype: Any, offset: int = 0) -> np.ndarray:
        """A numpy array backed by the region at `offset`."""
        return np.ndarray(shape, dtype=dtype, buffer=self._shm.buf, offset=offset)

    def slice_of(self, arr: np.ndarray) -> Any:
        """The slice a C-contiguous numpy view of this region occupies."""
        if not arr.flags.c_contiguous:
            raise ValueError("slice_of: the array must be C-contiguous")
        base = np.frombuffer(self._shm.buf, dtype=np.uint8)
        offset = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return self.slice(offset, arr.nbytes)

    def _release(self) -> None:
        self._shm.close()
        self._shm.unlink()

    def close(self) -> None:
        if not self._registered:
            return
        try:
            super().close()
        finally:  # even when the server is gone: the object must not outlive its owner
            self._release()


def _pci_bus_id(props: Any) -> str:
    """cudaDeviceGetPCIBusId's form from torch's device properties ('' when torch lacks them)."""
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return ""
    return f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"


def _libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def _allocation_offset(ptr: int) -> int:
    """ptr's offset from the start of its cudaMalloc allocation (cuMemGetAddressRange)."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise DraftHeadError("FAILED_PRECONDITION", f"cuMemGetAddressRange failed ({rc})")
    return ptr - base.value


def _cuda_ipc_handle(exported: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle_t inside torch's export of a storage. Recent torch prefixes it
    with a format version byte and a kind byte ('c': a cudaMalloc block; 'e': an expandable
    segment, whose memory has no cudaIpcMemHandle_t); older torch gives the 64 bytes alone."""
    exported = bytes(exported)
    if len(exported) == 64:
        return exported
    if len(exported) == 66 and exported[1:2] == b"c":
        return exported[2:]
    if len(exported) >= 2 and exported[1:2] == b"e":
        raise ValueError("from_tensor: the tensor lives in an expandable segment, which has no CUDA IPC "
                         "handle; run without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    raise ValueError(f"from_tensor: torch exported a {len(exported)}-byte handle of an unknown format")


def tensor_region_request(name: str, tensor: Any) -> Any:
    """The RegisterRegionRequest (CUDA_IPC) of a contiguous torch CUDA tensor, through its storage's
    own IPC handle (also how a same-host lane registers its CUDA arenas)."""
    if not tensor.is_cuda or not tensor.is_contiguous():
        raise ValueError("from_tensor: want a contiguous CUDA tensor")
    storage = tensor.untyped_storage()
    # (device, handle, storage bytes, storage offset in the allocation, ...): torch's own export.
    shared = storage._share_cuda_()
    handle, storage_offset = _cuda_ipc_handle(shared[1]), shared[3]
    import torch  # present: the tensor is one
    device = _pci_bus_id(torch.cuda.get_device_properties(tensor.device))
    offset = storage_offset + tensor.storage_offset() * tensor.element_size()
    return pb.RegisterRegionRequest(name=name, kind=pb.CUDA_IPC, cuda_ipc_handle=bytes(handle), cuda_device=device,
                                    offset=int(offset), byte_size=int(tensor.numel() * tensor.element_size()))


class CudaRegion(_Region):
    """CUDA memory of this process registered by its IPC handle as a CUDA_IPC region; the server
    maps it on its GPU. Holds a reference to the tensor / array so the memory outlives the
    registration."""

    def __init__(self, head: "RemoteDraftHead", name: str, *, handle: bytes, device: str, offset: int, nbytes: int,
                 base_ptr: int, owner: Any):
        super().__init__(head, name, nbytes)
        self.owner, self.base_ptr = owner, int(base_ptr)
        self._register(pb.RegisterRegionRequest(name=name, kind=pb.CUDA_IPC, cuda_ipc_handle=bytes(handle),
                                                cuda_device=device, offset=int(offset), byte_size=int(nbytes)))

    @classmethod
    def from_tensor(cls, head: "RemoteDraftHead", name: str, tensor: Any) -> "CudaRegion":
        """A contiguous torch CUDA tensor, registered through its storage's own IPC handle."""
        r = tensor_region_request(name, tensor)
        return cls(head, name, handle=r.cuda_ipc_handle, device=r.cuda_device, offset=r.offset,
                   nbytes=r.byte_size, base_ptr=tensor.data_ptr(), owner=tensor)

    @classmethod
    def from_cupy(cls, head: "RemoteDraftHead", name: str, array: Any) -> "CudaRegion":
        """A C-contiguous cupy array (its allocation's IPC handle; cupy's pool suballocates)."""
        import cupy  # noqa: F401  (present: the array is one)
        if not array.flags.c_contiguous:
            raise ValueError("from_cupy: want a C-contiguous array")
        ptr = array.data.ptr
        handle = cupy.cuda.runtime.ipcGetMemHandle(ptr)
        device = cupy.cuda.runtime.deviceGetPCIBusId(array.device.id)
        return cls(head, name, handle=handle, device=device, offset=_allocation_offset(ptr),
                   nbytes=array.nbytes, base_ptr=ptr, owner=array)

    def slice_of(self, view: Any) -> Any:
        """The slice a contiguous view (torch tensor or cupy array) of the registered memory occupies."""
        ptr = view.data_ptr() if hasattr(view, "data_ptr") else view.data.ptr
        nbytes = view.numel() * view.element_size() if hasattr(view, "numel") else view.nbytes
        return self.slice(ptr - self.base_ptr, nbytes)
