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
                            self.assertEqual(np.asarray(u).dtype, np.asarray(v).dtype)
        ring_calls = self.lane.lane()
        self.assertIsNotNone(ring_calls)

    def test_out_arrays_are_filled_and_returned(self):
        # out= (torch's convention): the caller's arrays of the result's types and sizes, any shape,
        # filled and returned, over the lane and over gRPC alike; a wrong one is refused by name.
        rng = np.random.default_rng(9)
        x = bf16_bits(rng.standard_normal((6, K)).astype(np.float32))
        for head in (self.lane, self.grpc):
            want = self.grpc.topk(x, 5, probs=True)
            out = (np.zeros((30,), want.ids.dtype), np.zeros((6, 5), np.float32), np.zeros((3, 10), np.float32))
            got = head.topk(x, 5, probs=True, out=out)
            for o, g, w in zip(out, got, want):
                self.assertIs(g, o)
                np.testing.assert_array_equal(o.reshape(w.shape), w)
            ids = np.zeros(6, want.ids.dtype)
            vals = np.zeros(6, np.float32)
            a = head.argmax(x, out=(ids, vals))
            self.assertIs(a.ids, ids)
            np.testing.assert_array_equal(ids, self.grpc.argmax(x).ids)
            logits = np.zeros((6, VOCAB), np.uint16)
            self.assertIs(head.logits(x, out=logits), logits)
            np.testing.assert_array_equal(logits, self.grpc.logits(x))
            with self.assertRaisesRegex(ValueError, r"out \(values\)"):
                head.topk(x, 5, out=(np.zeros(30, want.ids.dtype), np.zeros(29, np.float32)))
            with self.assertRaisesRegex(ValueError, r"out \(ids\)"):
                head.argmax(x, out=(np.zeros(6, np.float64), np.zeros(6, np.float32)))
            with self.assertRaisesRegex(ValueError, "probs exactly when"):
                head.topk(x, 5, probs=True, out=out[:2])

    def test_answers_outlive_their_slot(self):
        # A lane answer is read out of a ring slot that later calls reuse: what a call returned
        # must stay as it was after every slot has served other rows.
        rng = np.random.default_rng(11)
        x = bf16_bits(rng.standard_normal((5, K)).astype(np.float32))
        kept = self.lane.topk(x, 7, probs=True)
        kept_copy = [a.copy() for a in kept]
        for _ in range(3 * self.lane.lane()._depth):
            self.lane.topk(bf16_bits(rng.standard_normal((8, K)).astype(np.float32)), 7, probs=True)
        for a, b, c in zip(kept, kept_copy, self.grpc.topk(x, 7, probs=True)):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)

    def test_a_host_lane_asked_for_cuda_arenas_keeps_serving_and_says_why(self):
        # A host caller's first call opens a lane without CUDA arenas; a later torch CUDA call asks
        # for them (lane(cuda_device=...)). This server serves no CUDA shared memory: the same lane
        # serves on, its cuda_error says why, and no lane is opened again on later calls.
        head = dc.RemoteDraftHead(self.target, lane="required", timeout=30)
        try:
            x = bf16_bits(np.ones((2, K), np.float32))
            head.argmax(x)
            first = head.lane()
            self.assertFalse(first.cuda_asked)
            for _ in range(3):
                self.assertIs(head.lane(cuda_device="cuda:0"), first)
            self.assertIn("no CUDA shared memory", first.cuda_error)
            np.testing.assert_array_equal(head.argmax(x)[0], self.grpc.argmax(x)[0])
        finally:
            head.close()

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

    def test_c_abi_entries(self):
        """The library's C ABI driven directly (what lane.py builds on): dh_lane_call, one C call a
        request, around the ring; its refusal before reserving and an in-band refusal; the
        step-wise entries with two calls in flight; the stream-ordered entries without CUDA."""
        import ctypes
        from drafthead_client import lane as lanemod
        pb, eq = dc.pb, np.testing.assert_array_equal
        x = bf16_bits(np.random.default_rng(3).standard_normal((3, K)).astype(np.float32))
        want = self.grpc.topk(x, 5)

        def desc(rows=3, hidden=lanemod._NO_SLICE):
            return lanemod._pack(9, rows, pb.BF16, pb.TOP_K, 0, 0, 5, False, 0.0, 0, hidden, lanemod._NO_SLICE)

        def check_answer(n):
            done = lib.dh_lane_completion(h, n)
            fields = lanemod._COMPLETION.unpack(ctypes.string_at(done, lanemod._COMPLETION.size))
            self.assertEqual((fields[2], fields[1], fields[3], fields[5]), (0, 9, 3, 5))  # code, id, rows, k
            words = np.frombuffer(ctypes.string_at(done + 512, 3 * 5 * 8), "<u4")
            eq(words[:15].view("<i4").reshape(3, 5), want.ids)
            eq(words[15:].view("<f4").reshape(3, 5), want.values)

        with dc.RemoteDraftHead(self.target, lane="required", timeout=30) as head:
            ln = head.lane()
            lib, h = ln._lib, ln._h
            self.assertEqual(lib.dh_lane_abi_version(), 6)
            msg = ctypes.create_string_buffer(512)
            depth = lib.dh_lane_depth(h)
            seqs = []
            for _ in range(depth + 2):
                n = lib.dh_lane_call(h, desc(), x.tobytes(), x.nbytes, 10**10, msg, len(msg))
                self.assertGreaterEqual(n, 0, msg.value)
                check_answer(n)
                lib.dh_lane_release(h, n)
                seqs.append(n)
            self.assertEqual(seqs, list(range(seqs[0], seqs[0] + depth + 2)))
            big = bytes(ln._hidden_slot + 1)
            self.assertEqual(lib.dh_lane_call(h, desc(), big, len(big), 10**9, msg, len(msg)), -3)  # INVALID_ARGUMENT
            self.assertIn(b"hidden", msg.value)
            n = lib.dh_lane_call(h, desc(rows=0), b"", 0, 10**10, msg, len(msg))
            self.assertEqual(n, seqs[-1] + 1)  # the refusal above reserved nothing
            self.assertEqual(lanemod._COMPLETION.unpack(ctypes.string_at(lib.dh_lane_completion(h, n), 92))[2], 3)
            lib.dh_lane_release(h, n)
            seq, pending = ctypes.c_uint64(), []
            for _ in range(2):
                self.assertEqual(lib.dh_lane_reserve(h, 10**10, ctypes.byref(seq), msg, len(msg)), 0, msg.value)
                slot = seq.value % depth
                ctypes.memmove(lib.dh_lane_hidden_area(h, slot), x.tobytes(), x.nbytes)
                lib.dh_lane_publish(h, seq.value, desc(hidden=(0, lib.dh_lane_hidden_offset(h, slot), x.nbytes)))
                pending.append(seq.value)
            for n in pending:
                ptr = ctypes.c_void_p()
                self.assertEqual(lib.dh_lane_wait(h, n, 10**10, ctypes.byref(ptr), msg, len(msg)), 0, msg.value)
                self.assertEqual(ptr.value, lib.dh_lane_completion(h, n))
                self.assertEqual(lib.dh_lane_done(h, n), 1)
                check_answer(n)
                lib.dh_lane_release(h, n)
            self.assertEqual(lib.dh_lane_call_stream(h, desc(), 0, 0, None, 1, 10**9, None, 5, msg, len(msg)), -3)
            self.assertIn(b"copies", msg.value)
            self.assertEqual(lib.dh_lane_call_stream(h, desc(), 0, 0, None, 1, 10**9, None, 0, msg, len(msg)), -9)
            self.assertIn(b"dh_lane_cuda_attach", msg.value)
            self.assertEqual(lib.dh_lane_submit_stream(h, desc(), 0, 0, None, 1, 10**9, msg, len(msg)), -9)
            self.assertIn(b"dh_lane_cuda_attach", msg.value)
            self.assertEqual(lib.dh_lane_finish_stream(h, 0, None, 0, 1, 10**9, msg, len(msg)), 9)
            self.assertIn(b"dh_lane_cuda_attach", msg.value)
            self.assertEqual(lib.dh_lane_stream_synchronize(h, 0, msg, len(msg)), 0)
            self.assertEqual(lib.dh_lane_cuda_copy_kernel(h, -1, msg, len(msg)), 0)  # not attached: off, and why
            self.assertIn(b"dh_lane_cuda_attach", msg.value)
            self.assertEqual(lib.dh_lane_cuda_host_io(h, 1, msg, len(msg)), 0)  # likewise
            self.assertIn(b"dh_lane_cuda_attach", msg.value)
            self.assertEqual(head.argmax(x).ids.shape, (3,))  # and the lane goes on

    def test_stream_plans(self):
        """A stream-ordered call's fixed parts (what the torch path sends; the GPU runs it in
        tests/lane_cuda_test.py): the descriptor's fields, the rows' bytes, each answer piece's
        offset and bytes in the slot's answer, the copy triples for the caller's addresses; one plan
        a shape, and the cache bounded."""
        import ctypes
        from drafthead_client import lane as lanemod
        pb = dc.pb
        with dc.RemoteDraftHead(self.target, lane="required", timeout=30) as head:
            ln = head.lane()
            p = ln.stream_plan(pb.TOP_K, 5, False, 0, 8, True, 0.5, 0, 0, 7)
            self.assertIs(ln.stream_plan(pb.TOP_K, 5, False, 0, 8, True, 0.5, 0, 0, 7), p)
            f = lanemod._REQUEST.unpack(p.desc)
            self.assertEqual(f[1:9], (7, 5, pb.BF16, pb.TOP_K, 0, 0, 8,
                                      lanemod._FLAG_PROBS | lanemod._FLAG_FENCE | lanemod._FLAG_IDS64))
            self.assertAlmostEqual(f[9], 0.5)
            self.assertEqual((f[16], f[18], f[19]), (2, 0, 5 * 8 * 16))  # the slot's output area
            self.assertEqual(p.hidden_bytes, 5 * K * 2)
            self.assertEqual(p.pieces, ((0, 320), (320, 160), (480, 160)))
            arr = (ctypes.c_uint64 * 12)()
            _, n = p.copies(arr, (1000, 2000, 0))  # no probs wanted: two pieces
            self.assertEqual((n, list(arr[:6])), (2, [1000, 0, 320, 2000, 320, 160]))
            full = ln.stream_plan(pb.FULL_LOGITS, 3, True, pb.FP32)
            self.assertEqual((full.hidden_bytes, full.pieces), (3 * K * 4, ((0, 3 * VOCAB * 4),)))
            self.assertEqual(lanemod._REQUEST.unpack(full.desc)[8], lanemod._FLAG_FENCE)  # float logits: no ids64
            arg = ln.stream_plan(pb.ARGMAX, 2, False)
            self.assertEqual(arg.pieces, ((0, 16), (16, 8), None))
            for t in range(1500):  # a caller varying its temperature: the cache stays bounded
                ln.stream_plan(pb.TOP_K, 1, False, 0, 4, False, 1.0 + t)
            self.assertLessEqual(len(ln._plans), 1024)

    def _load_over_the_lane(self, concurrency, requests):
        """`drafthead-client load --lane=shm` (M = 3 TOP_K k = 4): its JSON report, no errors."""
        out = os.path.join(self.dir, f"lane{concurrency}.json")
        p = subprocess.run([CLIENT, "load", f"--target={self.target}", "--lane=shm", "--rows=3", "--mode=topk", "--k=4",
                            f"--concurrency={concurrency}", f"--requests={requests}", "--duration=60",
                            f"--json={out}"], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(out) as f:
            r = json.load(f)
        self.assertEqual(r["config"]["lane"], "shm")
        self.assertEqual(r["runs"][0].get("errors", 0), 0, json.dumps(r["runs"][0])[:400])
        return r["runs"][0]

    def test_load_tester_over_the_lane(self):
        point = self._load_over_the_lane(6, 300)
        self.assertGreaterEqual(point["ok"], 300)
        self.assertIn("in_flight_mean", point)

    def test_load_tester_keeps_its_concurrency_over_the_lane(self):
        # One lane of depth 16 from 4 threads: a thread whose next call's slot still holds another
        # thread's answer defers that call; the window must be whole again once it starts (each
        # deferral used to cost the window a call for good: 64 callers kept ~17 in flight).
        point = self._load_over_the_lane(16, 3000)
        self.assertGreaterEqual(point["in_flight_mean"], 12, json.dumps(point)[:600])


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
