"""Shared-memory regions from the Python client and the load tester, against a real CPU
drafthead-server (--shared-memory=system, tp=2, cropped vocabulary): numpy arrays in a registered
POSIX region give the bytes path's answers bit for bit, errors carry the server's codes, a closed
region is gone, the asyncio client registers and computes in a region too, and `drafthead-client load
--shared-memory=system` reports like the bytes path.
About 4 s."""

import asyncio
import json
import os
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import CLIENT, RealServerTestCase, bf16_bits  # noqa: E402

import drafthead_client as dc  # noqa: E402
from drafthead_client.regions import SystemRegion, _cuda_ipc_handle  # noqa: E402

K, PADDED, VOCAB = 256, 4096, 4001


class ClientRegionsTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=4", f"--hidden-size={K}", f"--padded-vocab={PADDED}", f"--vocab-size={VOCAB}", "--tp=2",
                   "--threads=1", "--shared-memory=system"]

    def test_info_lists_the_kinds(self):
        self.assertEqual(self.head.info(refresh=True)["shared_memory"], ["SYSTEM"])

    def test_numpy_in_a_region_equals_the_bytes_path(self):
        rng = np.random.default_rng(1)
        bits = bf16_bits(rng.standard_normal((5, K)).astype(np.float32))
        with SystemRegion(self.head, "np", 1 << 20) as r:
            x = r.ndarray((5, K), np.uint16, offset=64)
            y = r.ndarray((5, VOCAB), np.float32, offset=8192)
            x[:] = bits
            resp = self.head.compute_in_regions("full", 5, r.slice_of(x), logits_region=r.slice_of(y), dtype="fp32")
            self.assertEqual(len(resp.logits), 0)
            np.testing.assert_array_equal(y, self.head.logits(bits, dtype="fp32"))
            resp = self.head.compute_in_regions("topk", 5, r.slice_of(x), k=8, probs=True)
            want = self.head.topk(bits, 8, probs=True)
            np.testing.assert_array_equal(np.asarray(resp.token_ids).reshape(5, 8), want.ids)
            np.testing.assert_array_equal(np.asarray(resp.probs, np.float32).reshape(5, 8), want.probs)
            with self.assertRaises(dc.DraftHeadError) as e:
                self.head.compute_in_regions("full", 5, r.slice_of(x), logits_region=r.slice(8192, 10))
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.assertIn("logits_region", e.exception.message)
            with self.assertRaises(dc.DraftHeadError) as e:
                SystemRegion(self.head, "np", 4096)
            self.assertEqual(e.exception.code, "ALREADY_EXISTS")
        with self.assertRaises(dc.DraftHeadError) as e:  # closed: gone from the server
            self.head.compute_in_regions("argmax", 5, r.slice(64, 5 * K * 2))
        self.assertEqual(e.exception.code, "NOT_FOUND")

    def test_the_async_client_registers_and_computes_in_regions(self):
        from multiprocessing import shared_memory
        rng = np.random.default_rng(2)
        bits = bf16_bits(rng.standard_normal((3, K)).astype(np.float32))
        want = self.head.logits(bits, dtype="fp32")
        shm = shared_memory.SharedMemory(create=True, size=1 << 16)
        try:
            x = np.ndarray((3, K), np.uint16, buffer=shm.buf)
            y = np.ndarray((3, VOCAB), np.float32, buffer=shm.buf, offset=x.nbytes)
            x[:] = bits

            async def run():
                async with dc.AsyncRemoteDraftHead(self.target) as head:
                    await head.register_region(dc.pb.RegisterRegionRequest(
                        name="aio", kind=dc.pb.SYSTEM, shm_key="/" + shm.name.lstrip("/"), byte_size=1 << 16))
                    hid = dc.pb.RegionSlice(region="aio", offset=0, byte_size=x.nbytes)
                    out = dc.pb.RegionSlice(region="aio", offset=x.nbytes, byte_size=y.nbytes)
                    await head.compute_in_regions("full", 3, hid, logits_region=out, dtype="fp32")
                    top = await head.compute_in_regions("topk", 3, hid, k=4)
                    await head.unregister_region("aio")
                    with self.assertRaises(dc.DraftHeadError) as e:
                        await head.compute_in_regions("argmax", 3, hid)
                    self.assertEqual(e.exception.code, "NOT_FOUND")
                    return top

            top = asyncio.run(run())
            np.testing.assert_array_equal(y, want)
            np.testing.assert_array_equal(np.asarray(top.token_ids).reshape(3, 4), self.head.topk(bits, 4).ids)
            del x, y
        finally:
            shm.close()
            shm.unlink()

    def test_load_tester_through_a_region(self):
        reports = {}
        for way in ("", "system"):
            out = os.path.join(self.dir, f"load{way}.json")
            subprocess.run([CLIENT, "load", f"--target={self.target}", "--mode=full", "-n", "40", "--quiet",
                            f"--shared-memory={way}", f"--json={out}"], check=True, timeout=120)
            with open(out) as f:
                reports[way] = json.load(f)
        self.assertEqual(reports["system"]["config"]["shared_memory"], "system")
        self.assertEqual(reports[""]["config"]["shared_memory"], "off")
        for r in reports.values():
            self.assertEqual(r["runs"][0]["ok"], 40)
            self.assertEqual(r["runs"][0]["errors"], 0)


class TorchHandleFormatTest(unittest.TestCase):
    """torch's storage export of a CUDA IPC handle, as the H200 run met it (2026-12-03: 66 bytes,
    version and kind bytes before the cudaIpcMemHandle_t), without torch or a GPU."""

    def test_the_64_bytes_are_found_in_every_format(self):
        raw = bytes(range(64))
        self.assertEqual(_cuda_ipc_handle(raw), raw)                 # older torch
        self.assertEqual(_cuda_ipc_handle(b"\x01c" + raw), raw)     # version, cudaMalloc block

    def test_an_expandable_segment_or_unknown_format_is_refused_with_the_reason(self):
        with self.assertRaisesRegex(ValueError, "expandable"):
            _cuda_ipc_handle(b"\x01e" + bytes(80))
        with self.assertRaisesRegex(ValueError, "65-byte"):
            _cuda_ipc_handle(bytes(65))


if __name__ == "__main__":
    unittest.main()
