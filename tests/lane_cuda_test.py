"""The same-host lane with torch CUDA tensors (GPU machines; skips elsewhere): against a server
started with --lanes and --shared-memory=system,cuda (DRAFTHEAD_TARGET, or one it starts itself from
DRAFTHEAD_BIN_DIR), every mode over the lane's CUDA arenas -- waiting on the host (wait=True) and
stream-ordered (wait=False, then synchronize) -- equals lane="off" (gRPC, host copies) bit for bit;
rows produced by a slow kernel just before the call are read only after it (the fence); the
library's copy kernel (rows and fence in one launch, the answer and consumed word in another) and its
libcuda copies give the same answers, in turns, each with host IO (rows into the host arena, token
answers inline in the completion) and without (the CUDA arenas both ways); an error
raises at once with wait=True and at synchronize() with wait=False; a server timing one batch in 4
(--cuda-stage-events-every) answers the other three step_untimed through the lane. REPEAT (default 50) rounds of
random inputs, as GPU tests run here: a flaky answer is a race until shown otherwise."""

import os
import subprocess
import sys
import tempfile
import time
import unittest
import weakref

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    import torch  # type: ignore
    HAVE_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    torch, HAVE_GPU = None, False

import drafthead_client as dc  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "50"))


@unittest.skipUnless(HAVE_GPU, "no CUDA GPU with torch here")
class LaneCudaTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.proc = None
        cls.target = os.environ.get("DRAFTHEAD_TARGET")
        if not cls.target:
            from client_test_util import RealServer
            cls.server = RealServer(["--synthetic=3", "--hidden-size=512", "--padded-vocab=8192", "--vocab-size=8000",
                                     "--tp=1", "--backend=cuda", "--comm=nccl", "--shared-memory=system,cuda",
                                     "--lanes=4", "--max-rows=64", "--cuda-stage-events-every=4"],
                                    tempfile.mkdtemp(prefix="dh-lane-cuda-"))
            cls.target = cls.server.target
        else:
            cls.server = None
        cls.lane = dc.RemoteDraftHead(cls.target, lane="required", timeout=60)
        cls.grpc = dc.RemoteDraftHead(cls.target, lane="off", timeout=60)
        cls.K = cls.grpc.info()["hidden_size"]
        # The lane with its CUDA arenas, whichever test runs first (a first call with host rows
        # opens one without; the first CUDA call then replaces it: test_a_host_lane_gains_cuda_arenas).
        opened = cls.lane.lane(cuda_device=torch.device("cuda", torch.cuda.current_device()))
        assert opened.cuda, opened.cuda_error

    @classmethod
    def tearDownClass(cls):
        cls.lane.close()
        cls.grpc.close()
        if cls.server is not None:
            cls.server.close()

    def eq(self, a, b):
        if a is None or b is None:
            self.assertIs(a, b)
            return
        self.assertEqual(a.device.type, "cuda")
        self.assertEqual(a.dtype, b.dtype)
        self.assertTrue(torch.equal(a.cpu(), b.cpu()), "lane and gRPC answers differ")

    def copy_kernel(self, on):
        """The lane's copy kernel on or off (it must have loaded: the library here is built with CUDA)."""
        used, why = self.lane.lane().copy_kernel(on)
        self.assertEqual(used, on, why)

    def ways(self, copy_kernel, host_io):
        """The copy kernel and host IO on or off (both available: the library here has CUDA)."""
        self.copy_kernel(copy_kernel)
        used, why = self.lane.lane().host_io(host_io)
        self.assertEqual(used, host_io, why)

    def restore_ways(self):
        self.copy_kernel(True)
        self.lane.lane().host_io(True)  # the library's default

    def test_host_io_is_available(self):
        used, why = self.lane.lane().host_io()
        self.assertEqual(why, "")
        self.assertTrue(used)  # on by default

    def test_the_copy_kernel_is_loaded_and_on(self):
        used, why = self.lane.lane().copy_kernel()  # asks: on by default wherever it loaded
        self.assertTrue(used, why)
        self.assertEqual(why, "")

    def test_a_host_lane_gains_cuda_arenas(self):
        # A client whose first call sends host rows opens a lane without CUDA arenas; its first
        # torch CUDA call replaces that lane, once, by one with arenas on the tensor's GPU: the
        # order of a client's calls does not decide its way. Host rows then take the new lane too.
        import numpy as np
        head = dc.RemoteDraftHead(self.target, lane="required", timeout=60)
        try:
            xn = dc.float32_to_bf16(np.random.default_rng(4).standard_normal((5, self.K), dtype=np.float32))
            np.testing.assert_array_equal(head.topk(xn, 8)[0], self.grpc.topk(xn, 8)[0])
            first = head.lane()
            self.assertFalse(first.cuda)
            first_h, first = weakref.ref(first), None  # closed once nothing holds it (the client does not)
            x = torch.randn(5, self.K, device="cuda").to(torch.bfloat16)
            for i in range(REPEAT):
                got = head.topk(x, 8, wait=i % 2 == 0)
                head.synchronize()
                want = self.grpc.topk(x, 8)
                self.eq(got[0], want[0])
                self.eq(got[1], want[1])
            now = head.lane()
            self.assertTrue(now.cuda, now.cuda_error)
            self.assertIsNone(first_h(), "the replaced lane is still held (so still open)")
            np.testing.assert_array_equal(head.topk(xn, 8)[0], self.grpc.topk(xn, 8)[0])
            self.assertIs(head.lane(), now)
        finally:
            head.close()

    def test_host_calls_between_stream_ordered_ones(self):
        # One lane, host rows and stream-ordered CUDA calls mixed: a stream-ordered call's slot is
        # held until the library looks at its answer (its next call, or synchronize()), so host calls
        # after it, more than the lane's depth of them, take that slot back instead of waiting for a
        # call that does not come; and none overwrites an answer its stream has not copied out yet.
        import numpy as np
        depth = self.lane.lane()._depth
        rng = np.random.default_rng(6)
        for i in range(REPEAT):
            x = torch.randn(1 + i % 7, self.K, device="cuda").to(torch.bfloat16)
            got = self.lane.topk(x, 8, wait=False)
            t0 = time.monotonic()
            for _ in range(depth + 2):
                xn = dc.float32_to_bf16(rng.standard_normal((3, self.K), dtype=np.float32))
                np.testing.assert_array_equal(self.lane.argmax(xn)[0], self.grpc.argmax(xn)[0])
            self.assertLess(time.monotonic() - t0, 10, "host calls waited for a held slot")
            self.lane.synchronize()
            want = self.grpc.topk(x, 8)
            self.eq(got[0], want[0])
            self.eq(got[1], want[1])

    def test_a_submitted_call_keeps_its_slot_until_it_finishes(self):
        # A call published before its answer's tensors exist (submit, allocate, finish): another
        # thread's calls, more than the lane's depth of them on another stream, wait for its finish
        # instead of taking its slot, and both threads' answers are their own.
        import threading
        ln, pb = self.lane.lane(), dc.pb
        depth = ln._depth
        for i in range(max(1, REPEAT // 5)):
            x = torch.randn(4, self.K, device="cuda").to(torch.bfloat16)
            xs = [torch.randn(1 + j % 5, self.K, device="cuda").to(torch.bfloat16) for j in range(depth + 2)]
            wants = [self.grpc.topk(v, 3) for v in [x] + xs]
            torch.cuda.synchronize()
            got, failed = [], []

            def other():
                try:
                    with torch.cuda.stream(torch.cuda.Stream()):
                        got.extend(self.lane.topk(v, 3) for v in xs)
                except Exception as e:  # noqa: BLE001 (reported below)
                    failed.append(e)

            seq = ln.submit_cuda(mode=pb.TOP_K, x=x, top_k=3, timeout=30)
            t = threading.Thread(target=other)
            t.start()
            time.sleep(0.05)  # the other thread comes round to this call's slot meanwhile
            ids = torch.empty(4, 3, dtype=torch.int64, device="cuda")
            values = torch.empty(4, 3, device="cuda")
            ln.finish_cuda(seq, mode=pb.TOP_K, rows=4, top_k=3, out_ptrs=(ids.data_ptr(), values.data_ptr()),
                           timeout=30)
            t.join(60)
            self.assertFalse(t.is_alive(), "the other thread's calls hang")
            self.assertEqual(failed, [])
            self.eq(ids, wants[0].ids)
            self.eq(values, wants[0].values)
            for g, w in zip(got, wants[1:]):
                self.eq(g.ids, w.ids)
                self.eq(g.values, w.values)

    def test_a_finish_that_copies_nothing_or_too_much_still_finishes(self):
        # A caller that gave up between submit and finish (finish with no pieces), and a finish
        # whose pieces lie outside the answer (INVALID_ARGUMENT: nothing copied), both end the call:
        # the lane goes on, and a seq finished twice or never submitted is refused.
        ln, pb = self.lane.lane(), dc.pb
        x = torch.randn(2, self.K, device="cuda").to(torch.bfloat16)
        want = self.grpc.argmax(x)
        for i in range(max(1, REPEAT // 5)):
            seq = ln.submit_cuda(mode=pb.ARGMAX, x=x, timeout=30)
            ln.finish_cuda(seq, mode=pb.ARGMAX, rows=2, wait=i % 2 == 0, timeout=30)
            seq = ln.submit_cuda(mode=pb.ARGMAX, x=x, timeout=30)
            ids = torch.empty(10**6, dtype=torch.int64, device="cuda")
            with self.assertRaises(dc.DraftHeadError) as e:
                ln.finish_cuda(seq, mode=pb.ARGMAX, rows=10**6, out_ptrs=(ids.data_ptr(), ids.data_ptr()), timeout=30)
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.assertIn("outside", str(e.exception))
            for bad in (seq, seq + 1000):
                with self.assertRaises(dc.DraftHeadError) as e:
                    ln.finish_cuda(bad, mode=pb.ARGMAX, rows=2, timeout=30)
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.lane.synchronize()
            got = self.lane.argmax(x)
            self.eq(got.ids, want.ids)

    def test_closing_with_calls_in_flight(self):
        # A client closed while its stream-ordered calls are still queued on a stream (behind a GPU
        # sleep, so none has reached the GPU) and while another thread's host call waits: close()
        # returns, the other thread's call ends, the stream runs through (the waits it queued are
        # answered or failed, not left hanging on memory the lane gave back), and the process goes
        # on with a fresh client.
        import threading
        import numpy as np
        xn = dc.float32_to_bf16(np.random.default_rng(8).standard_normal((3, self.K), dtype=np.float32))
        for i in range(max(1, REPEAT // 10)):
            head = dc.RemoteDraftHead(self.target, lane="required", timeout=60)
            x = torch.randn(5, self.K, device="cuda").to(torch.bfloat16)
            head.topk(x, 8)  # the lane, with its CUDA arenas
            ended = []

            def host_calls():
                try:
                    for _ in range(200):
                        head.topk(xn, 4)
                except Exception as e:  # noqa: BLE001 (a closed lane's error ends the loop)
                    ended.append(e)

            t = threading.Thread(target=host_calls)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time ahead of the calls
                for _ in range(3):
                    head.topk(x, 8, wait=False)
            t.start()
            time.sleep(0.002)
            start = time.monotonic()
            head.close()
            t.join(30)
            self.assertFalse(t.is_alive(), "a host call hangs after close()")
            s.synchronize()  # returns: the stream's waits on the lane ended
            self.assertLess(time.monotonic() - start, 10.0)
        got = self.lane.topk(x, 8)
        self.eq(got.ids, self.grpc.topk(x, 8).ids)

    def test_every_mode_equals_grpc(self):
        g = torch.Generator(device="cuda").manual_seed(1)
        self.addCleanup(self.restore_ways)
        for i in range(REPEAT):
            self.ways(i % 4 < 2, i % 8 < 4)  # every mode, size and wait both ways, each way
            rows = [1, 5, 16, 64, 70][i % 5]  # 70 > max_rows: two calls
            dtype = torch.bfloat16 if i % 3 else torch.float32
            x = torch.randn(rows, self.K, device="cuda", generator=g).to(dtype)
            wait = i % 2 == 0
            a = [self.lane.logits(x, dtype="bf16", wait=wait), self.lane.logits(x, dtype="fp32", wait=wait),
                 self.lane.topk(x, 8, probs=True, temperature=0.8, wait=wait), self.lane.topk(x, 1 + i % 40, wait=wait),
                 self.lane.argmax(x, wait=wait), self.lane.sample(x, temperature=0.9, seed=i, wait=wait)]
            if not wait:
                self.lane.synchronize()
            b = [self.grpc.logits(x, dtype="bf16"), self.grpc.logits(x, dtype="fp32"),
                 self.grpc.topk(x, 8, probs=True, temperature=0.8), self.grpc.topk(x, 1 + i % 40),
                 self.grpc.argmax(x), self.grpc.sample(x, temperature=0.9, seed=i)]
            self.eq(a[0], b[0])
            self.eq(a[1], b[1])
            for u, v in zip(a[2:], b[2:]):
                for s, t in zip(u, v):
                    self.eq(s, t)
        self.assertTrue(self.lane.lane().cuda, self.lane.lane().cuda_error)

    def test_one_step_in_four_is_timed_and_the_answers_say_which(self):
        # The server this test starts times one batch in 4 (--cuda-stage-events-every=4): of 40
        # calls in a row, each a batch of its own, 10 carry stage times and 30 say step_untimed
        # with those stages 0, through the lane's completion flag.
        if self.server is None:
            self.skipTest("DRAFTHEAD_TARGET: the server's --cuda-stage-events-every is not known here")
        lane = self.lane.lane()
        x = np.random.default_rng(4).standard_normal((5, self.K), dtype=np.float32)
        req = dc.pb.LogitsRequest(rows=5, hidden_dtype=dc.pb.FP32, hidden=x.tobytes(), mode=dc.pb.TOP_K, top_k=8)
        timed = 0
        for i in range(40):
            t = lane.compute(req, 10.0).timing
            if t["step_untimed"]:
                self.assertEqual(t["h2d_us"] + t["gemv_us"] + t["epilogue_us"] + t["d2h_us"], 0, (i, t))
            else:
                self.assertGreater(t["gemv_us"], 0, (i, t))
                timed += 1
            self.assertGreater(t["compute_us"], 0, (i, t))
        self.assertEqual(timed, 10)

    def test_out_tensors_are_written_by_the_call(self):
        # out= over the lane's CUDA arenas: the library copies the answer (int64 ids from the server)
        # into the caller's tensors on the stream; equal to gRPC, any shape, more rows than max_rows
        # (chunks at their row offsets), wait=True and wait=False; wrong tensors refused by name.
        g = torch.Generator(device="cuda").manual_seed(2)
        V = self.grpc.info()["vocab_size"]
        self.addCleanup(self.restore_ways)
        for i in range(REPEAT):
            self.ways(i % 4 < 2, i % 8 < 4)
            rows = [1, 5, 16, 64, 70][i % 5]
            x = torch.randn(rows, self.K, device="cuda", generator=g).to(torch.bfloat16)
            wait = i % 2 == 0
            k = 1 + i % 40
            ids = torch.full((rows, k), -1, dtype=torch.int64, device="cuda")
            vals = torch.empty(rows * k, dtype=torch.float32, device="cuda")
            probs = torch.empty(rows, k, dtype=torch.float32, device="cuda")
            got = self.lane.topk(x, k, probs=True, temperature=0.8, wait=wait, out=(ids, vals, probs))
            a_ids = torch.empty(rows, dtype=torch.int64, device="cuda")
            a_vals = torch.empty(rows, dtype=torch.float32, device="cuda")
            am = self.lane.argmax(x, wait=wait, out=(a_ids, a_vals))
            logits = torch.empty(rows, V, dtype=torch.bfloat16, device="cuda")
            lg = self.lane.logits(x, dtype="bf16", wait=wait, out=logits)
            if not wait:
                self.lane.synchronize()
            self.assertIs(got.ids, ids)
            self.assertIs(am.ids, a_ids)
            self.assertIs(lg, logits)
            want = self.grpc.topk(x, k, probs=True, temperature=0.8)
            self.eq(ids, want.ids)
            self.eq(vals.view(rows, k), want.values)
            self.eq(probs, want.probs)
            wa = self.grpc.argmax(x)
            self.eq(a_ids, wa.ids)
            self.eq(a_vals, wa.values)
            self.eq(logits, self.grpc.logits(x, dtype="bf16"))
        x = torch.randn(3, self.K, device="cuda").to(torch.bfloat16)
        with self.assertRaisesRegex(ValueError, r"out \(ids\)"):
            self.lane.argmax(x, out=(torch.empty(3, dtype=torch.int32, device="cuda"),
                                     torch.empty(3, device="cuda")))
        with self.assertRaisesRegex(ValueError, r"out \(values\)"):
            self.lane.argmax(x, out=(torch.empty(3, dtype=torch.int64, device="cuda"), torch.empty(3)))
        with self.assertRaisesRegex(ValueError, r"out \(logits\)"):
            self.lane.logits(x, out=torch.empty(3, 7, dtype=torch.bfloat16, device="cuda"))

    def test_calls_from_two_streams_keep_their_answers(self):
        # Two streams take turns on one lane, around its slots many times (stream-ordered): each
        # call's answer is its own (a slot's next call on the other stream waits for the previous
        # answer's copy-out: the lane's consumed words).
        depth = self.lane.lane()._depth
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        self.addCleanup(self.restore_ways)
        for i in range(REPEAT):
            self.ways(i % 2 == 0, i % 4 < 2)
            xs = [torch.randn(1 + j % 7, self.K, device="cuda").to(torch.bfloat16) for j in range(3 * depth)]
            torch.cuda.synchronize()
            got = []
            for j, x in enumerate(xs):
                with torch.cuda.stream(streams[(j + i) % 2]):
                    if j % 5 == 0:
                        torch.cuda._sleep(100_000)  # this stream a little behind the other
                    got.append(self.lane.topk(x, 3, wait=False))
            self.lane.synchronize()
            torch.cuda.synchronize()
            for x, g in zip(xs, got):
                want = self.grpc.topk(x, 3)
                self.eq(g.ids, want.ids)
                self.eq(g.values, want.values)

    def test_rows_written_just_before_the_call_are_fenced(self):
        # The rows come out of work still queued on the stream when the call is made: the server
        # must wait for the stream's fence, not read stale rows.
        self.addCleanup(self.restore_ways)
        for i in range(REPEAT):
            self.ways(i % 4 < 2, i % 8 < 4)
            x = torch.randn(5, self.K, device="cuda").to(torch.bfloat16)
            want = self.grpc.topk(x, 4)
            torch.cuda.synchronize()
            y = torch.zeros_like(x)
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time ahead of the rows
            y.copy_(x)
            got = self.lane.topk(y, 4, wait=i % 2 == 0)
            self.lane.synchronize()
            self.eq(got.ids, want.ids)
            self.eq(got.values, want.values)

    def test_dspark_adapter_takes_the_lane(self):
        from drafthead_client import dspark_adapter as da
        head = dc.RemoteDraftHead(self.target, timeout=60)
        t = da._torch_transport(head, head.info())
        self.assertIsInstance(t, da.LaneTransport)
        x = torch.randn(5, self.K, device="cuda").to(torch.bfloat16)
        self.eq(t.logits(x, torch.bfloat16), self.grpc.logits(x, dtype="bf16"))
        t.close()

    def test_errors(self):
        x = torch.randn(2, self.K, device="cuda").to(torch.bfloat16)
        x[1, 3] = float("inf")
        with self.assertRaises(dc.DraftHeadError) as e:
            self.lane.argmax(x)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.lane.argmax(x, wait=False)  # returns at once; the failure comes at synchronize()
        with self.assertRaises(dc.DraftHeadError):
            self.lane.synchronize()
        ok = torch.randn(2, self.K, device="cuda").to(torch.bfloat16)
        self.assertEqual(tuple(self.lane.argmax(ok).ids.shape), (2,))


if __name__ == "__main__":
    unittest.main(verbosity=2)
