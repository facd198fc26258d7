"""AsyncRemoteDraftHead: RemoteDraftHead's methods as coroutines, over grpc.aio.

    from drafthead_client import AsyncRemoteDraftHead

    async def main():
        async with AsyncRemoteDraftHead("127.0.0.1:50051") as head:
            ids, values = await head.argmax(hidden)
            tops = await asyncio.gather(*(head.topk(h, 8) for h in batch))   # concurrent calls

Same inputs, results, errors (DraftHeadError), retries (UNAVAILABLE, with backoff, inside the
call's deadline) and deadlines as the sync client: both run the same plans (_HeadBase). Cancelling
a task awaiting a call cancels its RPC (the server sees the cancellation) and raises
asyncio.CancelledError in the task. The channel is opened on the first call, on the running event
loop: use one AsyncRemoteDraftHead from one loop.

The same-host lane (lane="auto" | "off" | "required", lane_depth; RemoteDraftHead's rules): the
lane is a blocking mechanism (a ctypes call that waits for its answer, the GIL released), so its
calls run in worker threads (asyncio.to_thread), any number at once up to the lane's depth; the
lane is opened and closed in a worker thread too, over a small blocking gRPC channel of its own
(GetModelInfo, OpenLane, CloseLane; same target, credentials and options), made only when the lane
mode is not "off". Cancelling an await whose call is on the lane returns at once, but the call
itself completes (its answer is dropped). torch CUDA tensors go through the lane's host rings
(copied to the host, as over gRPC): the CUDA arenas and stream-ordered calls (wait=False,
synchronize) are the sync client's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterable, AsyncIterator, Callable, Dict, Iterable, Optional, Union

import grpc
import grpc.aio

from . import (DType, DraftHeadError, Hidden, HeadKind, Lane, Mode, Plan, T, Tokens, TopK, _HeadBase, health_pb2,
               health_pb2_grpc, pb, pb_grpc)

__all__ = ["AsyncRemoteDraftHead"]


class AsyncRemoteDraftHead(_HeadBase):
    """A drafthead server as an LM head, for asyncio: every call is a coroutine; any number may be
    awaited at once on one channel."""

    def _open(self) -> None:
        if self.transport == "native":
            raise ValueError("transport='native': the asyncio client's calls go through grpcio's event loop")
        self.transport_in_use = "grpcio"
        self._channel: Optional[grpc.aio.Channel] = None  # opened on the running loop by _stubs()
        self._lane_channel: Optional[grpc.Channel] = None  # the lane's blocking channel (_lane_stub)
        self._lane_stub_: Any = None

    def _stubs(self) -> Any:
        if self._channel is None:
            if self._creds is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._creds, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._stub = pb_grpc.DraftHeadStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._stub

    # -- lifecycle ---------------------------------------------------------------------------------
    async def close(self) -> None:
        lane = self._take_lane()
        if lane is not None:
            await asyncio.to_thread(lane.close)
        if self._lane_channel is not None:
            self._lane_channel.close()
            self._lane_channel = self._lane_stub_ = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> "AsyncRemoteDraftHead":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- calls -------------------------------------------------------------------------------------
    async def _call(self, method: Callable[[Any], Any], request: Any, timeout: Optional[float]) -> Any:
        """One call with bounded retries on UNAVAILABLE, all inside one deadline. `method` picks the
        RPC off the stub (the stub exists only once the channel is open)."""
        deadline = self._deadline(timeout)
        attempt = 1
        while True:
            try:
                return await method(self._stubs())(request, timeout=max(0.001, deadline - time.monotonic()),
                                                   metadata=self._caller_md)
            except grpc.RpcError as e:
                await asyncio.sleep(self._retry_after(e, attempt, deadline))
                attempt += 1

    async def _compute(self, req: Any, timeout: Optional[float]) -> Any:
        """Every LogitsRequest goes out here (the one request path): through the same-host lane (in a
        worker thread) when there is one, else (or, in "auto" mode, when the lane is gone) over gRPC."""
        if self._lane_wanted(req):
            lane = await self.lane()
            if lane is not None:
                try:
                    return self._checked(req, await asyncio.to_thread(lane.compute, req, self._lane_timeout(timeout)))
                except DraftHeadError as e:
                    if not self._lane_dropped(lane, e):
                        raise
                    await asyncio.to_thread(lane.close)  # gRPC now, a new lane later
        return self._checked(req, await self._call(lambda s: s.ComputeLogits, req, timeout))

    # -- the same-host lane --------------------------------------------------------------------------
    def _lane_stub(self) -> Any:
        """The blocking stub the lane is opened and closed with (its own channel, made once)."""
        if self._lane_stub_ is None:
            self._lane_channel = self._blocking_channel()
            self._lane_stub_ = pb_grpc.DraftHeadStub(self._lane_channel)
        return self._lane_stub_

    async def lane(self) -> Optional[Lane]:
        """The open same-host lane (opening it, in a worker thread, when the lane mode allows), or
        None: calls use gRPC. With lane="required", raises DraftHeadError with the reason instead."""
        if self.lane_mode == "off":
            return None
        lane, due = self._lane_now()
        if not due:
            return lane
        return await asyncio.to_thread(self._lane_open, self._lane_stub(), self._call_blocking)

    async def _drive(self, plan: Plan[T], timeout: Optional[float]) -> T:
        """Runs a plan: each request it yields goes through _compute, in order."""
        try:
            req = next(plan)
            while True:
                req = plan.send(await self._compute(req, timeout))
        except StopIteration as done:
            return done.value

    async def info(self, refresh: bool = False) -> Dict[str, Any]:
        """GetModelInfo as a dict (cached)."""
        if self._info is None or refresh:
            self._info = self._info_dict(await self._call(lambda s: s.GetModelInfo, pb.ModelInfoRequest(), None))
        return self._info

    async def serving(self, timeout: float = 2.0) -> bool:
        """One grpc.health.v1 check of the whole server."""
        self._stubs()
        try:
            r = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
        return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

    async def wait_until_serving(self, timeout: float, poll: float = 0.2) -> None:
        end = time.monotonic() + timeout
        while not await self.serving(timeout=max(0.1, min(2.0, end - time.monotonic()))):
            if time.monotonic() + poll >= end:
                raise DraftHeadError("DEADLINE_EXCEEDED", f"{self.target} not SERVING within {timeout} s")
            await asyncio.sleep(poll)

    # -- public API (RemoteDraftHead's, awaited) -----------------------------------------------------
    async def logits(self, hidden: Hidden, *, dtype: DType = "bf16", head: HeadKind = "fp8",
                     hidden_dtype: DType = "bf16", timeout: Optional[float] = None) -> Any:
        """Full logits [..., vocab_size] (see the package docstring for the types)."""
        return await self._drive(self._logits_plan(await self.info(), hidden, dtype, head, hidden_dtype), timeout)

    async def topk(self, hidden: Hidden, k: int, *, probs: bool = False, temperature: float = 1.0,
                   head: HeadKind = "fp8", hidden_dtype: DType = "bf16", timeout: Optional[float] = None) -> TopK:
        """The k largest logits per row, best first (ties to the smaller id); probs over the whole vocabulary."""
        return TopK(*await self._drive(self._tokens_plan(await self.info(), hidden, "topk", hidden_dtype, head=head,
                                                         k=k, probs=probs, temperature=temperature), timeout))

    async def argmax(self, hidden: Hidden, *, head: HeadKind = "fp8", hidden_dtype: DType = "bf16",
                     timeout: Optional[float] = None) -> Tokens:
        i, v, _ = await self._drive(self._tokens_plan(await self.info(), hidden, "argmax", hidden_dtype, head=head),
                                    timeout)
        return Tokens(i, v)

    async def sample(self, hidden: Hidden, *, temperature: float, seed: int, head: HeadKind = "fp8",
                     hidden_dtype: DType = "bf16", timeout: Optional[float] = None) -> Tokens:
        """Gumbel-max sample per row; the draw depends only on (seed, row within the call, token id)."""
        i, v, _ = await self._drive(self._tokens_plan(await self.info(), hidden, "sample", hidden_dtype, head=head,
                                                      temperature=temperature, seed=seed), timeout)
        return Tokens(i, v)

    # -- shared-memory regions (register them with the sync client's drafthead_client.regions) --------
    async def register_region(self, request: Any, timeout: Optional[float] = None) -> None:
        """RegisterRegion with a pb.RegisterRegionRequest."""
        await self._call(lambda s: s.RegisterRegion, request, timeout)

    async def unregister_region(self, name: str, timeout: Optional[float] = None) -> None:
        """UnregisterRegion; an empty name: every region."""
        await self._call(lambda s: s.UnregisterRegion, pb.UnregisterRegionRequest(name=name), timeout)

    async def compute_in_regions(self, mode: Mode, rows: int, hidden_region: Any, *, logits_region: Any = None,
                                 hidden_dtype: DType = "bf16", dtype: DType = "bf16", k: int = 1,
                                 probs: bool = False, temperature: float = 1.0, seed: int = 0,
                                 head: HeadKind = "fp8", timeout: Optional[float] = None) -> Any:
        """RemoteDraftHead.compute_in_regions, awaited."""
        return await self._drive(self._regions_plan(mode, rows, hidden_region, logits_region, hidden_dtype, dtype, k,
                                                    probs, temperature, seed, head), timeout)

    async def stream(self, requests: Union[Iterable[Any], AsyncIterable[Any]],
                     timeout: Optional[float] = None) -> AsyncIterator[Any]:
        """StreamLogits: yields one LogitsResponse per LogitsRequest, in order (`async for`); in-band
        errors come as responses with `error` set. Leaving the loop early cancels the stream."""
        call = self._stubs().StreamLogits(requests, timeout=timeout)
        try:
            async for resp in call:
                yield resp
        except grpc.RpcError as e:
            raise DraftHeadError(e.code().name, e.details() or "") from None
        finally:
            call.cancel()  # a no-op once the stream has ended
