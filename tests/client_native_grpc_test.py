"""The Python client's native unary call (libdrafthead_grpc.so, transport="native"/"auto") against
grpcio's (transport="grpcio") on a real CPU server: the installed package carries and loads the
library, "auto" takes it, every mode's answers are the same bytes both ways, errors keep their
codes and messages, a deadline (against a slow fake server) and an unreachable target end the call
in bounded time, Ctrl-C interrupts a waiting call, close() cancels the calls running, a forked
child calls through grpcio and leaves the parent's connection intact, threads share one client,
and the options refuse what the native call cannot do. Tiny shapes; seconds."""

import os
import signal
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import Child, RealServerTestCase, free_port  # noqa: E402

import drafthead_client as dc  # noqa: E402
from drafthead_client import native_grpc  # noqa: E402

K = 256


def same(a, b):
    if isinstance(a, tuple):
        return all(same(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class NativeGrpcTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=4", f"--hidden-size={K}", "--padded-vocab=4096", "--vocab-size=4001", "--tp=1",
                   "--threads=1", "--max-rows=8"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.native = dc.RemoteDraftHead(cls.target, lane="off", transport="native", timeout=30)
        cls.grpcio = dc.RemoteDraftHead(cls.target, lane="off", transport="grpcio", timeout=30)
        cls.x = np.random.default_rng(3).standard_normal((11, K)).astype(np.float32)  # 11 > max_rows: two calls

    @classmethod
    def tearDownClass(cls):
        cls.native.close()
        cls.grpcio.close()
        cls.head.close()
        super().tearDownClass()

    def test_the_installed_package_carries_and_loads_the_library(self):
        lib, why = native_grpc.load_library()
        self.assertIsNotNone(lib, why)
        self.assertIn(os.path.join("drafthead_client", "_native"), lib._name)  # the wheel's copy
        self.assertEqual(self.head.transport_in_use, "native")  # "auto" takes it
        self.assertEqual(self.native.transport_in_use, "native")
        self.assertEqual(self.grpcio.transport_in_use, "grpcio")

    def test_every_mode_gives_the_same_bytes(self):
        for fn in (lambda h: h.logits(self.x, dtype="bf16"), lambda h: h.logits(self.x, dtype="fp32"),
                   lambda h: h.logits(self.x, hidden_dtype="fp32"),
                   lambda h: tuple(h.topk(self.x, 8, probs=True, temperature=0.7)),
                   lambda h: tuple(h.topk(self.x, 40)), lambda h: tuple(h.argmax(self.x)),
                   lambda h: tuple(h.sample(self.x, temperature=0.9, seed=7))):
            self.assertTrue(same(fn(self.native), fn(self.grpcio)))

    def test_full_logits_of_one_call_are_the_same_and_writable(self):
        x = self.x[:5]  # one call: its logits are the array returned, copied once off the wire
        for dtype in ("bf16", "fp32"):
            a, b = self.native.logits(x, dtype=dtype), self.grpcio.logits(x, dtype=dtype)
            self.assertTrue(same(a, b))
            self.assertTrue(a.flags.writeable and b.flags.writeable)

    def test_a_split_answer_reads_like_the_message(self):
        method = "/drafthead.v1.DraftHead/ComputeLogits"
        whole = self.native._native.unary(method, dc.pb.LogitsResponse)
        split = self.native._native.unary(method, dc.pb.LogitsResponse, split_field=5)
        hidden = self.x[:2].tobytes()
        full = dc.pb.LogitsRequest(rows=2, hidden=hidden, hidden_dtype=dc.pb.FP32, mode=dc.pb.FULL_LOGITS,
                                   logits_dtype=dc.pb.BF16)
        a, b = whole(full, timeout=30), split(full, timeout=30)
        self.assertIsInstance(b.logits, np.ndarray)
        self.assertEqual(b.logits.dtype, np.uint8)
        self.assertEqual(b.logits.tobytes(), a.logits)
        self.assertEqual((b.rows, b.vocab_size, b.logits_dtype), (a.rows, a.vocab_size, a.logits_dtype))
        self.assertFalse(b.HasField("error"))
        topk = dc.pb.LogitsRequest(rows=2, hidden=hidden, hidden_dtype=dc.pb.FP32, mode=dc.pb.TOP_K, top_k=5)
        c, d = whole(topk, timeout=30), split(topk, timeout=30)
        self.assertEqual(d.logits.size, 0)  # no logits field: an empty array
        self.assertEqual(list(d.token_ids), list(c.token_ids))
        self.assertEqual(list(d.values), list(c.values))

    def test_errors_keep_their_code_and_message(self):
        errors = []
        for h in (self.native, self.grpcio):
            with self.assertRaises(dc.DraftHeadError) as cm:
                h.topk(self.x, 100000)
            errors.append((cm.exception.code, str(cm.exception)))
        self.assertEqual(errors[0], errors[1])
        self.assertEqual(errors[0][0], "INVALID_ARGUMENT")

    def test_a_deadline_ends_the_call(self):
        # The fake server takes 2 s a request: a 50 ms deadline must end the call at ~50 ms.
        with Child([f"--hidden-size={K}", "--delay-us=2000000", "--workers=2"]) as slow:
            with dc.RemoteDraftHead(slow.target, lane="off", transport="native", timeout=30) as h:
                self.assertEqual(h.transport_in_use, "native")
                t0 = time.monotonic()
                with self.assertRaises(dc.DraftHeadError) as cm:
                    h._compute(dc.pb.LogitsRequest(rows=1, hidden=b"\0" * 2 * K, mode=dc.pb.ARGMAX), 0.05)
                self.assertEqual(cm.exception.code, "DEADLINE_EXCEEDED")
                self.assertLess(time.monotonic() - t0, 1.0)

    def test_close_cancels_the_calls_running(self):
        # A call waiting on a 2 s fake server, the client closed from another thread meanwhile: the
        # call ends CANCELLED at once (as with a grpcio channel), close() returns, later calls refused.
        with Child([f"--hidden-size={K}", "--delay-us=2000000", "--workers=2"]) as slow:
            h = dc.RemoteDraftHead(slow.target, lane="off", transport="native", timeout=30)
            got = []

            def run():
                try:
                    h._compute(dc.pb.LogitsRequest(rows=1, hidden=b"\0" * 2 * K, mode=dc.pb.ARGMAX), None)
                    got.append("answered")
                except dc.DraftHeadError as e:
                    got.append(e.code)

            t = threading.Thread(target=run)
            t.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            h.close()
            t.join(5)
            self.assertFalse(t.is_alive())
            self.assertLess(time.monotonic() - t0, 1.0)
            self.assertEqual(got, ["CANCELLED"])
            with self.assertRaises(dc.DraftHeadError) as cm:
                h._compute(dc.pb.LogitsRequest(rows=1, hidden=b"\0" * 2 * K, mode=dc.pb.ARGMAX), None)
            self.assertEqual(cm.exception.code, "CANCELLED")

    def test_ctrl_c_interrupts_a_waiting_call(self):
        # SIGINT 0.3 s into a call on a 2 s fake server: KeyboardInterrupt within ~0.2 s of it (the
        # call waits in slices), the call cancelled, the client still answering after.
        with Child([f"--hidden-size={K}", "--delay-us=2000000", "--workers=2"]) as slow:
            with dc.RemoteDraftHead(slow.target, lane="off", transport="native", timeout=30) as h:
                req = dc.pb.LogitsRequest(rows=1, hidden=b"\0" * 2 * K, mode=dc.pb.ARGMAX)
                timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
                t0 = time.monotonic()
                timer.start()
                with self.assertRaises(KeyboardInterrupt):
                    h._compute(req, None)
                self.assertLess(time.monotonic() - t0, 1.0)
                self.assertEqual(h._compute(req, None).rows, 1)

    def test_a_forked_child_calls_through_grpcio_and_the_parent_keeps_its_channel(self):
        want = self.grpcio.argmax(self.x)
        self.assertTrue(same(tuple(self.native.argmax(self.x)), tuple(want)))
        pid = os.fork()
        if pid == 0:  # the child: the inherited client works (through grpcio) and exits 0
            code = 3
            try:
                code = 0 if same(tuple(self.native.argmax(self.x, timeout=10)), tuple(want)) else 4
            finally:
                os._exit(code)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                self.fail("the forked child's call hung")
            time.sleep(0.02)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        # The parent's connection is intact: native calls still answer (without the fix: its deadline).
        self.assertTrue(same(tuple(self.native.argmax(self.x, timeout=10)), tuple(want)))
        self.assertEqual(self.native.transport_in_use, "native")

    def test_an_unreachable_target_is_unavailable_in_bounded_time(self):
        with dc.RemoteDraftHead(f"127.0.0.1:{free_port()}", lane="off", transport="native", timeout=3,
                                attempts=2) as h:
            t0 = time.monotonic()
            with self.assertRaises(dc.DraftHeadError) as cm:
                h._compute(dc.pb.LogitsRequest(rows=1, hidden=b"\0" * 2 * K, mode=dc.pb.ARGMAX), None)
            self.assertIn(cm.exception.code, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            self.assertLess(time.monotonic() - t0, 6)

    def test_threads_share_one_client(self):
        want = self.grpcio.argmax(self.x)
        bad = []

        def run():
            for _ in range(20):
                if not same(tuple(self.native.argmax(self.x)), tuple(want)):
                    bad.append(1)

        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual(bad, [])

    def test_the_options_refuse_what_the_native_call_cannot_do(self):
        with self.assertRaises(ValueError):
            dc.RemoteDraftHead(self.target, transport="native", tls=True)
        with self.assertRaises(ValueError):
            dc.RemoteDraftHead(self.target, transport="native", balance_replicas=True)
        with self.assertRaises(ValueError):
            dc.RemoteDraftHead(self.target, transport="quic")
        with self.assertRaises(ValueError):
            dc.AsyncRemoteDraftHead(self.target, transport="native")
        with dc.RemoteDraftHead(self.target, tls=True) as h:  # "auto" with TLS: grpcio
            self.assertEqual(h.transport_in_use, "grpcio")


if __name__ == "__main__":
    unittest.main(verbosity=2)
