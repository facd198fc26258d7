"""The Python client and the C++ client (drafthead-client logits) give identical answers from a real
drafthead-server: CPU backend, Gloo, tp=2, synthetic weights at tiny shapes. Also a short load run
against it. Loopback only; the server is stopped at the end."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import BIN, CLIENT, bf16_bits, free_port, read_safetensors, stop, write_safetensors  # noqa: E402

import drafthead_client as dc  # noqa: E402

SERVER = os.path.join(BIN, "server", "drafthead-server")
K, PADDED = 256, 4096


class E2EParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dh-e2e-client-")
        port = free_port()
        cls.target = f"127.0.0.1:{port}"
        cls.log = open(os.path.join(cls.dir, "server.log"), "w")
        cls.proc = subprocess.Popen(
            [SERVER, "--synthetic=1", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=2", "--backend=cpu",
             "--comm=gloo", f"--listen={cls.target}"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        p = subprocess.run([CLIENT, "info", f"--target={cls.target}", "--wait=120", "--json"],
                           capture_output=True, text=True, timeout=150)
        if p.returncode != 0:
            cls.tearDownClass()
            with open(os.path.join(cls.dir, "server.log")) as f:
                raise RuntimeError(f"server did not serve: {p.stderr}\n--- server log ---\n{f.read()[-4000:]}")
        cls.info = json.loads(p.stdout)
        cls.head = dc.RemoteDraftHead(cls.target, timeout=60)
        rng = np.random.default_rng(3)
        cls.x = rng.standard_normal((7, K)).astype(np.float32)
        cls.bits = bf16_bits(cls.x)
        cls.hid = os.path.join(cls.dir, "h.safetensors")
        write_safetensors(cls.hid, {"h": ("BF16", cls.bits)})

    @classmethod
    def tearDownClass(cls):
        stop(cls.proc, timeout=40)
        cls.log.close()

    def cli(self, *args):
        out = os.path.join(self.dir, "out.safetensors")
        subprocess.run([CLIENT, "logits", f"--target={self.target}", f"--hidden={self.hid}", "--tensor=h",
                        f"--out={out}", "--timeout=60s"] + list(args), check=True, timeout=120)
        return {k: v[1] for k, v in read_safetensors(out).items()}

    def test_info(self):
        self.assertEqual(self.info["hidden_size"], K)
        self.assertEqual(self.info["tp"], 2)
        self.assertEqual(self.info["padded_vocab"], PADDED)

    def test_full_logits(self):
        V = self.info["vocab_size"]
        np.testing.assert_array_equal(self.cli("--mode=full")["logits"], self.head.logits(self.bits))
        f32 = self.head.logits(self.bits, dtype="fp32")
        self.assertEqual(f32.shape, (7, V))
        np.testing.assert_array_equal(self.cli("--mode=full", "--dtype=fp32")["logits"], f32)
        # fp32 hidden rows are rounded to bf16 by the server: the same answer.
        np.testing.assert_array_equal(self.head.logits(bf16_bits(self.x).astype(np.uint16), dtype="fp32"),
                                      self.head.logits(self.x, dtype="fp32"))

    def test_reductions(self):
        f32 = self.head.logits(self.bits, dtype="fp32")
        top = self.head.topk(self.bits, 6, probs=True, temperature=0.9)
        c = self.cli("--mode=topk", "--k=6", "--probs", "--temperature=0.9")
        np.testing.assert_array_equal(c["token_ids"], top.ids)
        np.testing.assert_array_equal(c["values"], top.values)
        np.testing.assert_array_equal(c["probs"], top.probs)
        am = self.head.argmax(self.bits)
        c = self.cli("--mode=argmax")
        np.testing.assert_array_equal(c["token_ids"][:, 0], am.ids)
        np.testing.assert_array_equal(c["values"][:, 0], am.values)
        np.testing.assert_array_equal(am.ids, top.ids[:, 0])
        np.testing.assert_array_equal(am.ids, f32.argmax(1))  # the full logits agree with the reduction
        s = self.head.sample(self.bits, temperature=0.8, seed=5)
        c = self.cli("--mode=sample", "--temperature=0.8", "--seed=5")
        np.testing.assert_array_equal(c["token_ids"][:, 0], s.ids)
        np.testing.assert_array_equal(c["values"][:, 0], s.values)

    def test_short_load(self):
        js = os.path.join(self.dir, "load.json")
        subprocess.run([CLIENT, "load", f"--target={self.target}", "-c", "4", "-n", "60", "-z", "60s", "--rows=5",
                        "--mode=argmax", "--quiet", f"--json={js}"], check=True, timeout=120)
        with open(js) as f:
            r = json.load(f)["runs"][0]
        self.assertEqual(r["ok"], 60)
        self.assertEqual(r["errors"], 0)
        self.assertGreater(r["server_us"]["compute"]["p50"], 0)
        self.assertGreaterEqual(r["batch_rows_p50"], 5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
