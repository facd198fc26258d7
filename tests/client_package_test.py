"""The Python client as a user installs it: the wheel in a fresh venv (ctest's python_venv fixture,
tests/client_python_install.sh), run with no PYTHONPATH. What the installed distribution declares
and carries; every mode through RemoteDraftHead and AsyncRemoteDraftHead against a real CPU
drafthead-server, the two equal bit for bit; 64 awaits in flight at once; the async client's
errors, retries, deadlines, stream and cancellation (a cancelled await cancels its RPC, seen by an
in-test grpc.aio server). About 5 s."""

import asyncio
import importlib.metadata as md
import os
import sys
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import Child, RealServerTestCase, bf16_bits  # noqa: E402

import drafthead_client as dc  # noqa: E402
from drafthead_client import AsyncRemoteDraftHead, pb, pb_grpc  # noqa: E402

K, PADDED, VOCAB = 128, 2048, 2001


class InstalledPackageTest(unittest.TestCase):
    def test_imported_from_the_venv_not_the_source_tree(self):
        self.assertNotIn("PYTHONPATH", os.environ)
        self.assertTrue(dc.__file__.startswith(sys.prefix), dc.__file__)
        self.assertNotEqual(sys.prefix, sys.base_prefix)  # a venv
        src = os.environ.get("DRAFTHEAD_SOURCE_DIR")
        if src:  # (the build folder may lie inside the checkout: compare with the package's sources)
            self.assertFalse(os.path.realpath(dc.__file__).startswith(os.path.realpath(os.path.join(src, "client"))),
                             dc.__file__)
        self.assertTrue(pb.__name__.startswith("drafthead_client._gen."), pb.__name__)

    def test_the_distribution(self):
        dist = md.distribution("drafthead-client")
        self.assertEqual(dist.version, dc.__version__)
        reqs = dist.requires or []
        for dep in ("grpcio", "protobuf", "numpy"):
            self.assertTrue(any(r.startswith(dep) and "extra" not in r for r in reqs), reqs)
        self.assertTrue(any(r.startswith("torch") and 'extra == "torch"' in r.replace("'", '"') for r in reqs), reqs)
        files = {str(f) for f in dist.files or []}
        for f in ("drafthead_client/py.typed", "drafthead_client/aio.py",
                  "drafthead_client/_gen/drafthead/v1/drafthead_pb2.pyi"):
            self.assertIn(f, files)
        # The lane's library travels in the wheel when the build has it, and then the wheel is
        # for linux x86-64 only.
        native = any(f.startswith("drafthead_client/_native/") and f.endswith(".so") for f in files)
        lane = os.environ.get("DRAFTHEAD_LANE_SO", "")
        self.assertEqual(native, bool(lane), f"the build's lane library: '{lane}'; in the wheel: {native}")
        if lane:
            self.assertIn("drafthead_client/_native/" + os.path.basename(lane), files)
        tags = [ln.split(": ", 1)[1] for ln in (dist.read_text("WHEEL") or "").splitlines() if ln.startswith("Tag: ")]
        self.assertEqual(tags, ["py3-none-linux_x86_64"] if native else ["py3-none-any"])


def hidden_kinds(x32):
    """The same rows as each input kind the client takes."""
    bits = bf16_bits(x32)
    return {"bf16 bits": bits, "float32": x32, "bytes": bits.tobytes()}


def every_mode(call):
    """Each mode's call on `call(method_name, *args, **kw)`, as a dict of results."""
    return {
        "full": lambda h: call("logits", h),
        "full fp32": lambda h: call("logits", h, dtype="fp32"),
        "full bf16 head": lambda h: call("logits", h, head="bf16"),
        "topk": lambda h: call("topk", h, 5, probs=True, temperature=0.7),
        "argmax": lambda h: call("argmax", h),
        "sample": lambda h: call("sample", h, temperature=0.9, seed=3),
    }


def assert_same(test, a, b, msg):
    if isinstance(a, tuple):
        test.assertEqual(type(a), type(b), msg)
        for x, y in zip(a, b):
            assert_same(test, x, y, msg)
    elif a is None or isinstance(a, bytes):
        test.assertEqual(a, b, msg)
    else:
        test.assertEqual((a.dtype, a.shape), (b.dtype, b.shape), msg)
        np.testing.assert_array_equal(a, b, err_msg=msg)


class SyncAndAsyncTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=6", f"--hidden-size={K}", f"--padded-vocab={PADDED}", f"--vocab-size={VOCAB}",
                   "--tp=2", "--threads=1", "--max-rows=8", "--keep-bf16"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x = np.random.default_rng(2).standard_normal((3, 4, K)).astype(np.float32)  # 12 rows: 2 calls

    def test_every_mode_sync_equals_async(self):
        sync = every_mode(lambda m, *a, **kw: getattr(self.head, m)(*a, **kw))

        async def run():
            async with AsyncRemoteDraftHead(self.target) as head:
                await head.wait_until_serving(30)
                self.assertTrue(await head.serving())
                self.assertEqual(await head.info(), self.head.info())
                modes = every_mode(lambda m, *a, **kw: getattr(head, m)(*a, **kw))
                out = {}
                for kind, h in hidden_kinds(self.x).items():
                    for mode, f in modes.items():
                        out[kind, mode] = await f(h)
                return out

        got = asyncio.run(run())
        for (kind, mode), a in got.items():
            want = sync[mode](hidden_kinds(self.x)[kind])
            assert_same(self, a, want, f"{kind} {mode}")
        self.assertEqual(got["bf16 bits", "full"].shape, (3, 4, VOCAB))
        self.assertEqual(got["float32", "topk"].ids.shape, (3, 4, 5))
        np.testing.assert_array_equal(got["bf16 bits", "argmax"].ids, got["bf16 bits", "topk"].ids[..., 0])

    def test_64_awaits_in_flight(self):
        rng = np.random.default_rng(9)
        xs = [rng.standard_normal((5, K)).astype(np.float32) for _ in range(64)]
        calls = ["argmax", "topk", "sample", "logits"]

        def call(head, i):
            m = calls[i % 4]
            if m == "topk":
                return head.topk(xs[i], 4, probs=True)
            if m == "sample":
                return head.sample(xs[i], temperature=1.0, seed=i)
            return getattr(head, m)(xs[i])

        async def run():
            async with AsyncRemoteDraftHead(self.target) as head:
                await head.info()
                t0 = time.monotonic()
                out = await asyncio.gather(*(call(head, i) for i in range(64)))
                return out, time.monotonic() - t0

        got, secs = asyncio.run(run())
        for i, a in enumerate(got):
            assert_same(self, a, call(self.head, i), f"call {i} ({calls[i % 4]})")
        print(f"64 concurrent awaits: {secs * 1e3:.0f} ms", file=sys.stderr)

    def test_async_errors_and_stream(self):
        bits = bf16_bits(self.x[0])

        async def run():
            async with AsyncRemoteDraftHead(self.target) as head:
                with self.assertRaises(dc.DraftHeadError) as e:
                    await head.topk(bits, 100000)
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                self.assertIn("top_k", e.exception.message)
                with self.assertRaises(ValueError):
                    await head.logits(np.zeros((2, K + 1), np.uint16))
                with self.assertRaises(TypeError):
                    await head.logits(np.zeros((2, K), np.int32))
                reqs = [pb.LogitsRequest(request_id=i, rows=1, hidden=bits[i].tobytes(), mode=pb.ARGMAX) for i in range(4)]
                reqs[1].rows = 0  # answered in-band, the stream goes on
                got = [r async for r in head.stream(reqs, timeout=30)]
                self.assertEqual([r.request_id for r in got], [0, 1, 2, 3])
                self.assertEqual([r.error.code for r in got], [0, 3, 0, 0])
                want = self.head.argmax(bits[:4])
                self.assertEqual([got[i].token_ids[0] for i in (0, 2, 3)], [int(want.ids[i]) for i in (0, 2, 3)])

        asyncio.run(run())


class AsyncFailuresTest(unittest.TestCase):
    """Retries and deadlines against drafthead-fake-server; cancellation against a grpc.aio server
    defined here, which records what its handler saw."""

    def test_retries_on_unavailable(self):
        x = np.zeros((2, 16), np.uint16)

        async def run(target, attempts):
            async with AsyncRemoteDraftHead(target, attempts=attempts, initial_backoff=0.01) as head:
                await head.info()
                return await head.argmax(x)

        with Child(["--hidden-size=16", "--vocab-size=40", "--fail-first=2"]) as s:
            self.assertEqual(asyncio.run(run(s.target, 3)).ids.shape, (2,))
        with Child(["--hidden-size=16", "--vocab-size=40", "--fail-first=2"]) as s:
            with self.assertRaises(dc.DraftHeadError) as e:
                asyncio.run(run(s.target, 1))
            self.assertEqual(e.exception.code, "UNAVAILABLE")

        async def unreachable():
            async with AsyncRemoteDraftHead("127.0.0.1:1", timeout=2, attempts=2) as head:
                await head.info()
        with self.assertRaises(dc.DraftHeadError) as e:
            asyncio.run(unreachable())
        self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_deadline_and_cancellation(self):
        import grpc

        class Stalled(pb_grpc.DraftHeadServicer):
            """Answers GetModelInfo; ComputeLogits waits until the client goes away."""

            def __init__(self):
                self.started, self.cancelled = asyncio.Event(), asyncio.Event()

            async def GetModelInfo(self, request, context):
                return pb.ModelInfo(hidden_size=4, vocab_size=10, max_rows=8, max_top_k=4)

            async def ComputeLogits(self, request, context):
                self.started.set()
                try:
                    while not context.cancelled() and not context.done():
                        await asyncio.sleep(0.01)
                finally:  # the RPC was cancelled (or the handler with it)
                    self.cancelled.set()
                return pb.LogitsResponse()

        async def run():
            servicer = Stalled()
            server = grpc.aio.server()
            pb_grpc.add_DraftHeadServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with AsyncRemoteDraftHead(f"127.0.0.1:{port}") as head:
                    x = np.zeros((1, 4), np.uint16)
                    t0 = time.monotonic()
                    with self.assertRaises(dc.DraftHeadError) as e:
                        await head.argmax(x, timeout=0.3)
                    self.assertEqual(e.exception.code, "DEADLINE_EXCEEDED")
                    self.assertLess(time.monotonic() - t0, 3)
                    await asyncio.wait_for(servicer.cancelled.wait(), 5)
                    servicer.started.clear()
                    servicer.cancelled.clear()
                    task = asyncio.create_task(head.argmax(x))
                    await asyncio.wait_for(servicer.started.wait(), 10)
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    await asyncio.wait_for(servicer.cancelled.wait(), 5)  # the server saw it
            finally:
                await server.stop(None)

        asyncio.run(run())


if __name__ == "__main__":
    unittest.main(verbosity=2)
