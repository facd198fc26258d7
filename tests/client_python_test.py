"""The Python client (client/python/drafthead_client) against drafthead-fake-server on loopback:
values against the toy head computed here in numpy, the input/output types, chunking past
max_rows, errors, retries, streams; and its answers equal the C++ CLI's."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import CLIENT, Child, bf16_bits, bf16_float, read_safetensors, toy_logits, write_safetensors  # noqa: E402

import drafthead_client as dc  # noqa: E402
from drafthead_client import pb  # noqa: E402

K, V = 48, 300


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Child([f"--hidden-size={K}", f"--vocab-size={V}", "--max-rows=4"])
        cls.head = dc.RemoteDraftHead(cls.server.target)
        cls.head.wait_until_serving(10)
        rng = np.random.default_rng(1)
        cls.x32 = rng.standard_normal((2, 3, K)).astype(np.float32)  # 6 rows: two calls of max_rows=4
        cls.bits = bf16_bits(cls.x32)

    @classmethod
    def tearDownClass(cls):
        cls.head.close()
        cls.server.close()

    def test_info(self):
        info = self.head.info()
        self.assertEqual(info["hidden_size"], K)
        self.assertEqual(info["vocab_size"], V)
        self.assertEqual(info["heads"], ["FP8_TWIN", "BF16_EXACT"])
        self.assertTrue(self.head.serving())

    def test_logits_types_and_values(self):
        want = toy_logits(self.bits, V).reshape(2, 3, V)
        got_bits = self.head.logits(self.bits)                      # uint16 in -> bf16 bits out
        self.assertEqual(got_bits.dtype, np.uint16)
        self.assertEqual(got_bits.shape, (2, 3, V))
        np.testing.assert_array_equal(got_bits, bf16_bits(want))
        got_f = self.head.logits(self.x32)                          # float32 in -> float32 out (bf16 values)
        self.assertEqual(got_f.dtype, np.float32)
        np.testing.assert_array_equal(got_f, bf16_float(bf16_bits(want)))
        got32 = self.head.logits(self.bits, dtype="fp32")
        self.assertEqual(got32.dtype, np.float32)
        np.testing.assert_array_equal(got32, want)
        raw = self.head.logits(self.bits.tobytes())                 # bytes in -> bytes out
        self.assertEqual(raw, bf16_bits(want).tobytes())
        raw32 = self.head.logits(self.x32.tobytes(), hidden_dtype="fp32", dtype="fp32")
        self.assertEqual(raw32, want.tobytes())
        one = self.head.logits(self.bits[0, 0])                     # a single row [K]
        self.assertEqual(one.shape, (V,))

    def test_reductions(self):
        y = toy_logits(self.bits, V)
        top = self.head.topk(self.bits, 5, probs=True, temperature=0.5)
        self.assertEqual(top.ids.shape, (2, 3, 5))
        self.assertEqual(top.ids.dtype, np.int32)
        order = np.lexsort((np.arange(V)[None, :].repeat(6, 0), -y), axis=1)[:, :5]  # value desc, id asc
        np.testing.assert_array_equal(top.ids.reshape(6, 5), order)
        np.testing.assert_array_equal(top.values.reshape(6, 5), np.take_along_axis(y, order, 1))
        z = y.astype(np.float64) / 0.5
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        np.testing.assert_allclose(top.probs.reshape(6, 5), np.take_along_axis(p, order, 1), rtol=1e-5, atol=1e-7)
        am = self.head.argmax(self.bits)
        self.assertEqual(am.ids.shape, (2, 3))
        np.testing.assert_array_equal(am.ids.reshape(6), order[:, 0])
        s1 = self.head.sample(self.bits, temperature=1.0, seed=7)
        s2 = self.head.sample(self.bits, temperature=1.0, seed=7)
        np.testing.assert_array_equal(s1.ids, s2.ids)
        self.assertTrue(((s1.ids >= 0) & (s1.ids < V)).all())
        np.testing.assert_array_equal(s1.values.reshape(6), y[np.arange(6), s1.ids.reshape(6)])

    def test_errors(self):
        with self.assertRaises(dc.DraftHeadError) as e:
            self.head.topk(self.bits, 100000)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("top_k", e.exception.message)
        with self.assertRaises(dc.DraftHeadError) as e:
            self.head.sample(self.bits, temperature=0.0, seed=1)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(ValueError):
            self.head.logits(np.zeros((2, K + 1), dtype=np.uint16))
        with self.assertRaises(TypeError):
            self.head.logits(np.zeros((2, K), dtype=np.int32))
        with self.assertRaises(dc.DraftHeadError) as e:
            dc.RemoteDraftHead("127.0.0.1:1", timeout=2, attempts=2).info()
        self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_stream(self):
        reqs = [pb.LogitsRequest(request_id=i, rows=1, hidden=self.bits[0, 0].tobytes(), mode=pb.ARGMAX)
                for i in range(5)]
        reqs[2].mode = pb.TOP_K
        reqs[2].top_k = 100000  # answered in-band, the stream goes on
        got = list(self.head.stream(reqs, timeout=20))
        self.assertEqual([r.request_id for r in got], list(range(5)))
        self.assertEqual(got[2].error.code, 3)
        self.assertEqual(got[0].error.code, 0)

    def test_retries_unavailable(self):
        with Child([f"--hidden-size={K}", f"--vocab-size={V}", "--fail-first=2"]) as s:
            h = dc.RemoteDraftHead(s.target, attempts=3, initial_backoff=0.01)
            self.assertEqual(h.argmax(self.bits[0]).ids.shape, (3,))
            h.close()
        with Child([f"--hidden-size={K}", f"--vocab-size={V}", "--fail-first=2"]) as s:
            h = dc.RemoteDraftHead(s.target, attempts=1)
            h.info()
            with self.assertRaises(dc.DraftHeadError) as e:
                h.argmax(self.bits[0])
            self.assertEqual(e.exception.code, "UNAVAILABLE")
            h.close()

    def test_torch_when_available(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch not installed")
        t = torch.from_numpy(self.x32).to(torch.bfloat16)
        out = self.head.logits(t)
        self.assertEqual(out.dtype, torch.bfloat16)
        np.testing.assert_array_equal(out.view(torch.int16).numpy().view(np.uint16), self.head.logits(self.bits))
        self.assertEqual(self.head.argmax(t).ids.dtype, torch.int64)

    def test_matches_the_cpp_cli(self):
        with tempfile.TemporaryDirectory() as d:
            hid = os.path.join(d, "h.safetensors")
            write_safetensors(hid, {"h": ("BF16", self.bits.reshape(6, K))})
            cases = [
                (["--mode=full"], lambda: {"logits": self.head.logits(self.bits).reshape(6, V)}),
                (["--mode=full", "--dtype=fp32"], lambda: {"logits": self.head.logits(self.bits, dtype="fp32").reshape(6, V)}),
                (["--mode=topk", "--k=7", "--probs", "--temperature=0.8"],
                 lambda: dict(zip(("token_ids", "values", "probs"),
                                  (a.reshape(6, 7) for a in self.head.topk(self.bits, 7, probs=True, temperature=0.8))))),
                (["--mode=argmax"], lambda: dict(zip(("token_ids", "values"), (a.reshape(6, 1) for a in self.head.argmax(self.bits))))),
                (["--mode=sample", "--temperature=0.9", "--seed=11"],
                 lambda: dict(zip(("token_ids", "values"),
                                  (a.reshape(6, 1) for a in self.head.sample(self.bits, temperature=0.9, seed=11))))),
            ]
            for args, py in cases:
                out = os.path.join(d, "out.safetensors")
                subprocess.run([CLIENT, "logits", f"--target={self.server.target}", f"--hidden={hid}", "--tensor=h",
                                f"--out={out}"] + args, check=True, timeout=60)
                cpp = read_safetensors(out)
                want = py()
                self.assertEqual(set(cpp), set(want), args)
                for name, arr in want.items():
                    np.testing.assert_array_equal(cpp[name][1], arr, err_msg=f"{args} {name}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
