"""The same-host lane from Python, against a real CPU drafthead-server (--lanes, tp=2, cropped
vocabulary): lane="required" answers equal lane="off" (gRPC) bit for bit in every mode and input
type, a bad request raises the server's code, "required" fails clearly where no lane can open and
"auto" falls back to gRPC (also when a lane breaks), AsyncRemoteDraftHead takes the lane too (its
calls in worker threads), the installed package loads its own libdrafthead_lane.so, and
`drafthead-client load --lane=shm` reports like the gRPC path. A few seconds."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import CLIENT, RealServer, RealServerTestCase, bf16_bits  # noqa: E402

import drafthead_client as dc  # noqa: E402

try:
    import torch  # type: ignore
except ImportError:  # pragma: no cover
    torch = None

K, PADDED, VOCAB = 256, 4096, 4001


class ClientLaneTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=4", f"--hidden-size={K}", f"--padded-vocab={PADDED}", f"--vocab-size={VOCAB}", "--tp=2",
                   "--threads=1", "--shared-memory=system", "--lanes=4", "--max-rows=8"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.lane = dc.RemoteDraftHead(cls.target, lane="required", timeout=30)
        cls.grpc = dc.RemoteDraftHead(cls.target, lane="off", timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.lane.close()
        cls.grpc.close()
        super().tearDownClass()

    def test_info_offers_lanes_on_this_host(self):
        info = self.grpc._call(self.grpc._stub.GetModelInfo, dc.pb.ModelInfoRequest(), 10)
        self.assertEqual(info.lanes, 4)
        from drafthead_client.lane import local_host_id
        self.assertEqual(info.host_id, local_host_id())
        self.assertIsNotNone(self.lane.lane())
        self.assertIsNone(self.grpc.lane())

    def test_the_installed_package_carries_its_library(self):
        from drafthead_client.lane import load_library
        lib = load_library()
        if not os.environ.get("DRAFTHEAD_LANE_LIB"):  # ctest sets none: the wheel's own copy
            native = os.path.join(os.path.dirname(os.path.realpath(dc.__file__)), "_native")
            self.assertTrue(os.path.realpath(lib._name).startswith(native + os.sep), lib._name)

    def test_async_client_uses_the_lane(self):
        rng = np.random.default_rng(11)
        x = bf16_bits(rng.standard_normal((11, K)).astype(np.float32))  # two calls (max_rows 8)
        calls = []

        async def run():
            async with dc.AsyncRemoteDraftHead(self.target, lane="required", timeout=30) as head:
                lane = await head.lane()
                self.assertIsNotNone(lane)
                compute = lane.compute
                lane.compute = lambda req, t: (calls.append(req.rows), compute(req, t))[1]
                one = [await head.logits(x), await head.logits(x, dtype="fp32"),
                       await head.topk(x, 7, probs=True, temperature=0.9), await head.argmax(x),
                       await head.sample(x, temperature=0.7, seed=5)]
                many = await asyncio.gather(*(head.argmax(x[i:i + 1]) for i in range(11)))
                with self.assertRaises(dc.DraftHeadError) as e:
                    await head.topk(x, 100000)
                return one, many, e.exception

        one, many, err = asyncio.run(run())
        eq = np.testing.assert_array_equal
        eq(one[0], self.grpc.logits(x))
        eq(one[1], self.grpc.logits(x, dtype="fp32"))
        for a, b in ((one[2], self.grpc.topk(x, 7, probs=True, temperature=0.9)), (one[3], self.grpc.argmax(x)),
                     (one[4], self.grpc.sample(x, temperature=0.7, seed=5))):
            for u, v in zip(a, b):
                if u is None:
                    self.assertIsNone(v)
                else:
                    eq(u, v)
        want = self.grpc.argmax(x)
        eq(np.concatenate([m.ids for m in many]), want.ids)
        self.assertEqual(len(calls), 5 * 2 + 11 + 1)  # every call went through the lane (the bad one too)
        self.assertEqual(err.code, "INVALID_ARGUMENT")
        with self.assertRaises(dc.DraftHeadError) as b:
            self.grpc.topk(x, 100000)
        self.assertEqual(str(err), str(b.exception))

    def test_auto_falls_back_when_the_lane_breaks(self):
        x = bf16_bits(np.ones((2, K), np.float32))
        want = self.grpc.argmax(x)

        def broken(req, timeout):
            raise dc.DraftHeadError("UNAVAILABLE", "the lane is closed")

        with dc.RemoteDraftHead(self.target, timeout=30) as head:  # lane="auto"
            lane = head.lane()
            self.assertIsNotNone(lane)
            lane.compute = broken
            np.testing.assert_array_equal(head.argmax(x).ids, want.ids)  # over gRPC
            self.assertIsNone(head._lane)
            self.assertIsNone(head.lane())  # not before 1 s

        async def run():
            async with dc.AsyncRemoteDraftHead(self.target, timeout=30) as head:
                lane = await head.lane()
                self.assertIsNotNone(lane)
                lane.compute = broken
                ids = (await head.argmax(x)).ids
                self.assertIsNone(head._lane)
                return ids

        np.testing.assert_array_equal(asyncio.run(run()), want.ids)
        with dc.RemoteDraftHead(self.target, lane="required", timeout=30) as head:  # no fallback
            head.lane().compute = broken
            with self.assertRaises(dc.DraftHeadError) as e:
                head.argmax(x)
            self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_every_mode_equals_grpc(self):
        rng = np.random.default_rng(7)
        inputs = [bf16_bits(rng.standard_normal((5, K)).astype(np.float32)),
                  rng.standard_normal((2, 3, K)).astype(np.float32),
                  bf16_bits(rng.standard_normal((11, K)).astype(np.float32))]  # 11 > max_rows: two calls
        if torch is not None:
            inputs.append(torch.randn(4, K, dtype=torch.bfloat16))
        eq = np.testing.assert_array_equal
        for x in inputs:
            with self.subTest(kind=type(x).__name__, shape=tuple(x.shape)):
                for dtype in ("bf16", "fp32"):
                    a, b = self.lane.logits(x, dtype=dtype), self.grpc.logits(x, dtype=dtype)
                    eq(np.asarray(a.float() if torch is not None and isinstance(a, torch.Tensor) else a),
                       np.asarray(b.float() if torch is not None and isinstance(b, torch.Tensor) else b))
                for a, b in ((self.lane.topk(x, 7, probs=True, temperature=0.9), self.grpc.topk(x, 7, probs=True, temperature=0.9)),
                             (self.lane.topk(x, 3), self.grpc.topk(x, 3)),
                             (self.lane.argmax(x), self.grpc.argmax(x)),
                             (self.lane.sample(x, temperature=0.7, seed=5), self.grpc.sample(x, temperature=0.7, seed=5))):
                    for u, v in zip(a, b):
                        if u is None:
                            self.assertIsNone(v)
                        else:
                            eq(np.asarray(u), np.asarray(v))
        ring_calls = self.lane.lane()
        self.assertIsNotNone(ring_calls)

    def test_bad_request_raises_the_servers_code(self):
        x = bf16_bits(np.ones((2, K), np.float32))
        with self.assertRaises(dc.DraftHeadError) as a:
            self.lane.topk(x, 100000)
        with self.assertRaises(dc.DraftHeadError) as b:
            self.grpc.topk(x, 100000)
        self.assertEqual(a.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(str(a.exception), str(b.exception))
        bad = bf16_bits(np.ones((1, K), np.float32))
        bad[0, 3] = 0x7F80  # +inf
        with self.assertRaises(dc.DraftHeadError) as c:
            self.lane.argmax(bad)
        self.assertIn("hidden_region", str(c.exception))  # the lane's rows arrive through its region
        self.assertEqual(self.lane.argmax(x).ids.shape, (2,))  # and the lane goes on

    def test_load_tester_over_the_lane(self):
        out = os.path.join(self.dir, "lane.json")
        p = subprocess.run([CLIENT, "load", f"--target={self.target}", "--lane=shm", "--rows=3", "--mode=topk", "--k=4",
                            "--concurrency=6", "--requests=300", "--duration=30", f"--json={out}"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            r = json.load(f)
        self.assertEqual(r["config"]["lane"], "shm")
        point = r["runs"][0]
        self.assertEqual(point.get("errors", 0), 0, json.dumps(point)[:400])
        self.assertGreaterEqual(point["ok"], 300)


class NoLaneServerTest(unittest.TestCase):
    def test_required_fails_clearly_and_auto_falls_back(self):
        d = tempfile.mkdtemp(prefix="dh-nolane-")
        server = RealServer(["--synthetic=4", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=1", "--threads=1"], d)
        try:
            x = bf16_bits(np.ones((2, K), np.float32))
            with dc.RemoteDraftHead(server.target, lane="required") as head:
                with self.assertRaises(dc.DraftHeadError) as e:
                    head.argmax(x)
                self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
                self.assertIn("lanes", str(e.exception))
            with dc.RemoteDraftHead(server.target) as head:  # lane="auto"
                self.assertEqual(head.argmax(x).ids.shape, (2,))
                self.assertIsNone(head.lane())
            with self.assertRaises(ValueError):
                dc.RemoteDraftHead(server.target, lane="sometimes")

            async def run():
                async with dc.AsyncRemoteDraftHead(server.target, lane="required") as head:
                    with self.assertRaises(dc.DraftHeadError) as e:
                        await head.argmax(x)
                    self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
                async with dc.AsyncRemoteDraftHead(server.target) as head:
                    self.assertEqual((await head.argmax(x)).ids.shape, (2,))
                    self.assertIsNone(await head.lane())
                with self.assertRaises(ValueError):
                    dc.AsyncRemoteDraftHead(server.target, lane="sometimes")

            asyncio.run(run())
        finally:
            server.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
