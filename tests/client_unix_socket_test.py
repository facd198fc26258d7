"""drafthead-server listening on a Unix socket (--listen=unix:PATH in a temp dir), called over it
from C++ and Python: health and ModelInfo (`drafthead-client info --wait`, RemoteDraftHead.serving),
the C++ CLI and the Python client giving identical answers, the asyncio client, the load tester
(unary over two channels, streams, and over a same-host lane: a unix: caller is on the server's host,
so ModelInfo's host_id matches and the lane opens); a second server on a live path refused (gRPC
alone would take the path over), a stale socket file replaced, a path too long to bind refused. CPU backend, tp=2, tiny shapes; a few seconds."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import BIN, CLIENT, bf16_bits, read_safetensors, stop, write_safetensors  # noqa: E402

import drafthead_client as dc  # noqa: E402

SERVER = os.path.join(BIN, "server", "drafthead-server")
K, PADDED, VOCAB = 256, 4096, 4001


class UnixSocketTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dh-unix-")
        cls.sock = os.path.join(cls.dir, "drafthead.sock")
        cls.target = f"unix:{cls.sock}"
        cls.log = open(os.path.join(cls.dir, "server.log"), "w")
        cls.proc = subprocess.Popen(
            [SERVER, "--synthetic=4", f"--hidden-size={K}", f"--padded-vocab={PADDED}", f"--vocab-size={VOCAB}",
             "--tp=2", "--threads=1", "--shared-memory=system", "--lanes=2", "--max-rows=8",
             f"--listen={cls.target}"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        # Connect only once the socket exists: an early refusal puts gRPC's channel into backoff.
        deadline = time.monotonic() + 120
        while cls.proc.poll() is None and not os.path.exists(cls.sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        p = subprocess.run([CLIENT, "info", f"--target={cls.target}", "--wait=120", "--json"],
                           capture_output=True, text=True, timeout=150)
        if p.returncode != 0:
            cls.tearDownClass()
            with open(os.path.join(cls.dir, "server.log")) as f:
                raise RuntimeError(f"server did not serve: {p.stderr}\n--- server log ---\n{f.read()[-4000:]}")
        cls.info = json.loads(p.stdout)
        cls.head = dc.RemoteDraftHead(cls.target, lane="off", timeout=30)
        rng = np.random.default_rng(5)
        cls.bits = bf16_bits(rng.standard_normal((6, K)).astype(np.float32))
        cls.hid = os.path.join(cls.dir, "h.safetensors")
        write_safetensors(cls.hid, {"h": ("BF16", cls.bits)})

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "head", None):
            cls.head.close()
        stop(cls.proc, timeout=40)
        cls.log.close()

    def cli(self, *args):
        out = os.path.join(self.dir, "out.safetensors")
        subprocess.run([CLIENT, "logits", f"--target={self.target}", f"--hidden={self.hid}", "--tensor=h",
                        f"--out={out}", "--timeout=60s"] + list(args), check=True, timeout=120)
        return {k: v[1] for k, v in read_safetensors(out).items()}

    def load(self, name, *args):
        js = os.path.join(self.dir, f"{name}.json")
        p = subprocess.run([CLIENT, "load", f"--target={self.target}", "-n", "80", "-z", "60s", "--rows=3",
                            "--mode=topk", "--k=4", "--quiet", f"--json={js}"] + list(args),
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(js) as f:
            r = json.load(f)
        run = r["runs"][0]
        self.assertEqual(run.get("errors", 0), 0, json.dumps(run)[:400])
        self.assertGreaterEqual(run["ok"], 80)
        return r

    def test_health_and_model_info(self):
        self.assertEqual(self.info["hidden_size"], K)
        self.assertEqual(self.info["vocab_size"], VOCAB)
        self.assertEqual(self.info["tp"], 2)
        self.assertTrue(self.head.serving())
        self.assertEqual(self.head.info()["vocab_size"], VOCAB)

    def test_cpp_and_python_agree(self):
        top = self.head.topk(self.bits, 5, probs=True)
        c = self.cli("--mode=topk", "--k=5", "--probs")
        np.testing.assert_array_equal(c["token_ids"], top.ids)
        np.testing.assert_array_equal(c["values"], top.values)
        np.testing.assert_array_equal(c["probs"], top.probs)
        np.testing.assert_array_equal(self.cli("--mode=full")["logits"], self.head.logits(self.bits))

    def test_asyncio_client(self):
        async def run():
            async with dc.AsyncRemoteDraftHead(self.target, lane="off", timeout=30) as head:
                return await head.argmax(self.bits)
        am = asyncio.run(run())
        np.testing.assert_array_equal(am.ids, self.head.argmax(self.bits).ids)

    def test_a_unix_caller_is_on_the_same_host(self):
        from drafthead_client.lane import local_host_id
        self.assertEqual(self.info["host_id"], local_host_id())
        with dc.RemoteDraftHead(self.target, lane="required", timeout=30) as lane_head:
            self.assertIsNotNone(lane_head.lane())
            np.testing.assert_array_equal(lane_head.argmax(self.bits).ids, self.head.argmax(self.bits).ids)

    def test_load_tester(self):
        self.assertEqual(self.load("unary", "-c", "4", "--connections=2")["config"]["target"], self.target)
        self.load("stream", "-c", "2", "--stream")
        self.assertEqual(self.load("lane", "-c", "3", "--lane=shm")["config"]["lane"], "shm")

    def test_a_second_server_does_not_take_the_path_over(self):
        p = subprocess.run([SERVER, "--synthetic=1", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=1",
                            "--threads=1", f"--listen={self.target}"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)  # common/exit_codes.h: failed
        self.assertIn("a server already listens on", p.stderr)
        self.assertTrue(self.head.serving())  # the first still answers on its socket
        self.assertEqual(self.head.info(refresh=True)["tp"], 2)

    def test_a_stale_socket_file_is_replaced(self):
        import socket
        path = os.path.join(self.dir, "stale.sock")
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)  # closed without listening: what a killed server leaves behind
        proc = subprocess.Popen([SERVER, "--synthetic=1", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=1",
                                 "--threads=1", f"--listen=unix:{path}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            p = subprocess.run([CLIENT, "info", f"--target=unix:{path}", "--wait=60", "--json"],
                               capture_output=True, text=True, timeout=90)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(json.loads(p.stdout)["tp"], 1)
        finally:
            stop(proc, timeout=30)

    def test_a_path_too_long_is_refused_by_name(self):
        p = subprocess.run([SERVER, "--synthetic=1", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=1",
                            "--listen=unix:/" + "a" * 120],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)  # common/exit_codes.h: could not start (bad flags too)
        self.assertIn("--listen", p.stderr)
        self.assertIn("at most 107", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
