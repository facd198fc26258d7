"""The KServe v2 API from Python's grpcio, with stubs generated from proto/inference/grpc_service.proto,
as a tritonclient-style caller uses it (numpy arrays as raw tensor bytes), against a real
drafthead-server (CPU, Gloo, tp=2, tiny shapes, --model-name=lmhead): every mode equal to the native
API's answer bit for bit, KServe and native requests in flight together, a stream with a bad request in
the middle, bad input refused by name, the system shared-memory extension (a POSIX region for the
input and every output); the load tester's --protocol=kserve. Loopback only; the server is stopped at the end."""

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import shared_memory

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import client_test_util  # noqa: E402
from client_test_util import BIN, CLIENT, RealServer, bf16_bits, free_port, kserve_tensors, stop  # noqa: E402

from drafthead_client import pb, pb_grpc  # noqa: E402
from drafthead_client._gen.inference import grpc_service_pb2 as kpb, grpc_service_pb2_grpc as kpb_grpc  # noqa: E402

SERVER = os.path.join(BIN, "server", "drafthead-server")
K, PADDED, MODEL = 128, 2048, "lmhead"
TIMEOUT = 60


infer_request = functools.partial(client_test_util.infer_request, MODEL)
class KServePythonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dh-kserve-py-")
        cls.target = f"127.0.0.1:{free_port()}"
        cls.log = open(os.path.join(cls.dir, "server.log"), "w")
        cls.proc = subprocess.Popen(
            [SERVER, "--synthetic=2", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=2", "--backend=cpu",
             "--comm=gloo", f"--listen={cls.target}", f"--model-name={MODEL}", "--shared-memory=system"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        cls.channel = grpc.insecure_channel(cls.target)
        cls.kserve = kpb_grpc.GRPCInferenceServiceStub(cls.channel)
        cls.native = pb_grpc.DraftHeadStub(cls.channel)
        deadline = time.monotonic() + 120
        while True:
            try:
                if cls.kserve.ServerReady(kpb.ServerReadyRequest(), timeout=5).ready:
                    break
            except grpc.RpcError:
                pass
            if cls.proc.poll() is not None or time.monotonic() > deadline:
                cls.tearDownClass()
                with open(os.path.join(cls.dir, "server.log")) as f:
                    raise RuntimeError(f"server did not serve\n--- server log ---\n{f.read()[-4000:]}")
            time.sleep(0.1)
        rng = np.random.default_rng(5)
        cls.bits = bf16_bits(rng.standard_normal((5, K)).astype(np.float32))

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        stop(cls.proc, timeout=40)
        cls.log.close()

    def infer(self, req):
        return kserve_tensors(self.kserve.ModelInfer(req, timeout=TIMEOUT))

    def native_answer(self, **fields):
        return self.native.ComputeLogits(pb.LogitsRequest(rows=self.bits.shape[0], hidden=self.bits.tobytes(), **fields),
                                         timeout=TIMEOUT)

    def assert_bad(self, req, prefix, code=grpc.StatusCode.INVALID_ARGUMENT):
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.ModelInfer(req, timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertTrue(e.exception.details().startswith(prefix), e.exception.details())

    def test_model_name_flag(self):
        self.assertTrue(self.kserve.ModelReady(kpb.ModelReadyRequest(name=MODEL), timeout=TIMEOUT).ready)
        meta = self.kserve.ModelMetadata(kpb.ModelMetadataRequest(name=MODEL, version="1"), timeout=TIMEOUT)
        self.assertEqual(meta.name, MODEL)
        self.assertEqual(list(meta.inputs[0].shape), [-1, K])
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.ModelConfig(kpb.ModelConfigRequest(name="drafthead"), timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_every_mode_equals_native(self):
        n = self.native_answer(logits_dtype=pb.FP32)
        got = self.infer(infer_request(self.bits, {"logits_dtype": "FP32"}))
        self.assertEqual(got["logits"].tobytes(), n.logits)
        n = self.native_answer()
        # FP32 rows are rounded to bf16 by the server: the same answer as the bf16 rows.
        x32 = (self.bits.astype(np.uint32) << 16).view(np.float32)
        got = self.infer(infer_request(x32, datatype="FP32"))
        self.assertEqual(got["logits"].tobytes(), n.logits)
        n = self.native_answer(mode=pb.TOP_K, top_k=9, return_probs=True, temperature=1.5)
        got = self.infer(infer_request(self.bits, {"mode": "top_k", "top_k": 9, "return_probs": True, "temperature": 1.5}))
        np.testing.assert_array_equal(got["token_ids"], np.array(n.token_ids, np.int32).reshape(5, 9))
        self.assertEqual(got["values"].tobytes(), np.array(n.values, np.float32).tobytes())
        self.assertEqual(got["probs"].tobytes(), np.array(n.probs, np.float32).tobytes())
        n = self.native_answer(mode=pb.ARGMAX)
        got = self.infer(infer_request(self.bits, {"mode": "argmax"}))
        self.assertEqual(got["token_ids"].shape, (5, 1))
        np.testing.assert_array_equal(got["token_ids"][:, 0], n.token_ids)
        n = self.native_answer(mode=pb.SAMPLE, temperature=0.5, seed=3)
        got = self.infer(infer_request(self.bits, {"mode": "sample", "temperature": 0.5, "seed": 3}))
        np.testing.assert_array_equal(got["token_ids"][:, 0], n.token_ids)
        self.assertEqual(got["values"].tobytes(), np.array(n.values, np.float32).tobytes())

    def test_both_apis_at_once(self):
        """KServe and native requests share the one queue and batcher; every answer is still exact."""
        want = self.native_answer(mode=pb.TOP_K, top_k=4)
        req = infer_request(self.bits, {"mode": "top_k", "top_k": 4})
        with ThreadPoolExecutor(8) as pool:
            ks = [pool.submit(self.infer, req) for _ in range(12)]
            ns = [pool.submit(self.native_answer, mode=pb.TOP_K, top_k=4) for _ in range(12)]
            for f in ks:
                np.testing.assert_array_equal(f.result()["token_ids"].ravel(), want.token_ids)
            for f in ns:
                self.assertEqual(list(f.result().token_ids), list(want.token_ids))

    def test_stream_goes_on_after_a_bad_request(self):
        reqs = [infer_request(self.bits, {"mode": "argmax"}, request_id="1"),
                infer_request(self.bits, {"mode": "sample", "temperature": -1.0}, request_id="2"),
                infer_request(self.bits, {"mode": "top_k", "top_k": 2}, request_id="3")]
        answers = {a.infer_response.id: a for a in self.kserve.ModelStreamInfer(iter(reqs), timeout=TIMEOUT)}
        self.assertEqual(sorted(answers), ["1", "2", "3"])
        self.assertEqual(answers["1"].error_message, "")
        self.assertTrue(answers["2"].error_message.startswith("INVALID_ARGUMENT: temperature:"), answers["2"].error_message)
        np.testing.assert_array_equal(kserve_tensors(answers["3"].infer_response)["token_ids"].ravel(),
                                      self.native_answer(mode=pb.TOP_K, top_k=2).token_ids)

    def load(self, *args, exit_code=0):
        js = os.path.join(self.dir, "load.json")
        p = subprocess.run([CLIENT, "load", f"--target={self.target}", "--protocol=kserve", f"--model-name={MODEL}",
                            "--rows=5", "-c", "2", "-z", "60s", "--quiet", f"--json={js}"] + list(args), timeout=120)
        self.assertEqual(p.returncode, exit_code)
        with open(js) as f:
            return json.load(f)["runs"][0]

    def test_load_tester_speaks_kserve(self):
        for stream in ([], ["--stream"]):
            r = self.load("-n", "30", "--mode=topk", "--k=8", *stream)
            self.assertEqual((r["ok"], r["errors"]), (30, 0), stream)
            self.assertGreater(r["server_us"]["compute"]["p50"], 0, "timing read from the response parameters")
            self.assertGreaterEqual(r["batch_rows_p50"], 5)
        # In-band stream errors keep their code (from the "CODE: " prefix).
        r = self.load("-n", "4", "--mode=topk", "--k=100000", "--stream", "--no-probe", exit_code=1)
        self.assertEqual(list(r["errors_by_code"]), ["INVALID_ARGUMENT"])
        self.assertEqual(r["ok"], 0)

    def test_system_shared_memory(self):
        """Triton's shared-memory extension on the server's one region registry: the input and every
        output through a POSIX region, equal to the inline answers; the native API sees the region."""
        meta = self.kserve.ServerMetadata(kpb.ServerMetadataRequest(), timeout=TIMEOUT)
        self.assertEqual(list(meta.extensions), ["model_configuration", "parameters", "statistics", "system_shared_memory"])
        seg = shared_memory.SharedMemory(create=True, size=1 << 20)
        try:
            base, size = 4096, 512 * 1024  # the region is [4096, 4096 + 512 KiB) of the object
            self.kserve.SystemSharedMemoryRegister(kpb.SystemSharedMemoryRegisterRequest(
                name="io", key="/" + seg.name, offset=base, byte_size=size), timeout=TIMEOUT)
            st = self.kserve.SystemSharedMemoryStatus(kpb.SystemSharedMemoryStatusRequest(), timeout=TIMEOUT)
            self.assertEqual((st.regions["io"].key, st.regions["io"].offset, st.regions["io"].byte_size),
                             ("/" + seg.name, base, size))
            x = self.bits.tobytes()
            seg.buf[base + 64:base + 64 + len(x)] = x

            def place(params, offset, nbytes, name="io"):
                params["shared_memory_region"].string_param = name
                params["shared_memory_byte_size"].int64_param = nbytes
                params["shared_memory_offset"].int64_param = offset

            def region(offset, n, dtype):
                return np.frombuffer(bytes(seg.buf[base + offset:base + offset + n]), dtype=dtype)

            req = infer_request(self.bits, {"mode": "top_k", "top_k": 3, "return_probs": True}, raw=b"",
                                outputs=["token_ids", "values", "probs"])
            del req.raw_input_contents[:]
            place(req.inputs[0].parameters, 64, len(x))
            place(req.outputs[0].parameters, 100000, 5 * 3 * 4)
            place(req.outputs[2].parameters, 110000, 4096)  # larger than the output: its start is used
            resp = self.kserve.ModelInfer(req, timeout=TIMEOUT)
            self.assertEqual([len(b) for b in resp.raw_output_contents], [0, 60, 0])  # Triton's layout
            n = self.native_answer(mode=pb.TOP_K, top_k=3, return_probs=True)
            np.testing.assert_array_equal(region(100000, 60, np.int32), n.token_ids)
            self.assertEqual(resp.raw_output_contents[1], np.array(n.values, np.float32).tobytes())
            self.assertEqual(region(110000, 60, np.float32).tobytes(), np.array(n.probs, np.float32).tobytes())
            # Full logits into the region (the native logits_region path), from the region's rows.
            req = infer_request(self.bits, outputs=["logits"])
            del req.raw_input_contents[:]
            place(req.inputs[0].parameters, 64, len(x))
            place(req.outputs[0].parameters, 200000, 5 * PADDED * 2)
            resp = self.kserve.ModelInfer(req, timeout=TIMEOUT)
            self.assertEqual(resp.raw_output_contents[0], b"")
            self.assertEqual(bytes(seg.buf[base + 200000:base + 200000 + 5 * PADDED * 2]), self.native_answer().logits)
            # The native API reads the same region (one registry for both APIs).
            nat = self.native.ComputeLogits(pb.LogitsRequest(rows=5, mode=pb.ARGMAX, hidden_region=pb.RegionSlice(
                region="io", offset=64, byte_size=len(x))), timeout=TIMEOUT)
            self.assertEqual(list(nat.token_ids), list(self.native_answer(mode=pb.ARGMAX).token_ids))

            def bad(mutate, prefix, code=grpc.StatusCode.INVALID_ARGUMENT):
                req = infer_request(self.bits, {"mode": "argmax"}, outputs=["token_ids"])
                mutate(req)
                self.assert_bad(req, prefix, code)
            bad(lambda r: place(r.outputs[0].parameters, 0, 3), "token_ids: shared_memory_byte_size 3 is less than")
            bad(lambda r: place(r.outputs[0].parameters, size - 8, 20), "token_ids: shared_memory_region: offset")
            bad(lambda r: place(r.outputs[0].parameters, 0, 20, "nope"),
                "token_ids: shared_memory_region: no region named 'nope'", grpc.StatusCode.NOT_FOUND)
            bad(lambda r: (place(r.inputs[0].parameters, 64, len(x), "nope"), r.ClearField("raw_input_contents")),
                "hidden: shared_memory_region: no region named 'nope'", grpc.StatusCode.NOT_FOUND)
            bad(lambda r: place(r.inputs[0].parameters, 64, len(x)), "hidden: its values come from more than one of shared memory (set)")
            with self.assertRaises(grpc.RpcError) as e:
                self.kserve.SystemSharedMemoryRegister(kpb.SystemSharedMemoryRegisterRequest(
                    name="io", key="/" + seg.name, byte_size=64), timeout=TIMEOUT)
            self.assertEqual(e.exception.code(), grpc.StatusCode.ALREADY_EXISTS)
            with self.assertRaises(grpc.RpcError) as e:
                self.kserve.SystemSharedMemoryRegister(kpb.SystemSharedMemoryRegisterRequest(
                    name="big", key="/" + seg.name, byte_size=2 << 20), timeout=TIMEOUT)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            with self.assertRaises(grpc.RpcError) as e:
                self.kserve.CudaSharedMemoryRegister(kpb.CudaSharedMemoryRegisterRequest(
                    name="gpu", raw_handle=b"\0" * 64, byte_size=64), timeout=TIMEOUT)
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("--shared-memory", e.exception.details())
            self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(name="io"), timeout=TIMEOUT)
            self.assertEqual(len(self.kserve.SystemSharedMemoryStatus(kpb.SystemSharedMemoryStatusRequest(),
                                                                      timeout=TIMEOUT).regions), 0)
            bad(lambda r: place(r.outputs[0].parameters, 0, 20), "token_ids: shared_memory_region: no region named 'io'",
                grpc.StatusCode.NOT_FOUND)
        finally:
            self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(), timeout=TIMEOUT)
            seg.close()
            seg.unlink()

    def test_bad_input_is_named(self):
        req = infer_request(self.bits)
        req.model_name = "drafthead"
        self.assert_bad(req, "unknown model 'drafthead'", grpc.StatusCode.NOT_FOUND)
        self.assert_bad(infer_request(self.bits, {"mode": "top_k", "top_k": 100000}), "top_k:")
        self.assert_bad(infer_request(self.bits, {"head": "bf16_exact"}), "head: BF16_EXACT is not served")
        self.assert_bad(infer_request(self.bits, raw=self.bits.tobytes()[:-2]), "hidden:")
        self.assert_bad(infer_request(self.bits, outputs=["logprobs"]), "outputs: unknown output 'logprobs'")
        inf = self.bits.copy()
        inf[4, 7] = 0x7F80
        self.assert_bad(infer_request(inf), "hidden: non-finite value at row 4, column 7")


class KServeStreamBackpressureTest(unittest.TestCase):
    """ModelStreamInfer counts against StreamLogits' budgets (--stream-buffer-bytes, stall timeout):
    a caller that sends 16 MiB answers' worth of requests and never reads is not read further and is
    cancelled after --stream-stall-timeout, and the server goes on answering others. About 4 s."""

    def test_a_stream_that_never_reads_is_cancelled_and_costs_only_itself(self):
        d = tempfile.mkdtemp(prefix="dh-kserve-budget-")
        server = RealServer(["--tp=1", "--backend=cpu", "--comm=gloo", "--threads=1", "--synthetic=3",
                             "--hidden-size=64", "--padded-vocab=65536", "--max-rows=64",
                             "--stream-buffer-bytes=4000000", "--stream-buffer-total-bytes=8000000",
                             "--stream-stall-timeout=2s"], d)
        try:
            stub = kpb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.target))
            x = np.ones((64, 64), np.float32)
            req = kpb.ModelInferRequest(model_name="drafthead")
            req.inputs.add(name="hidden", datatype="FP32", shape=[64, 64])
            req.raw_input_contents.append(x.tobytes())
            req.parameters["logits_dtype"].string_param = "FP32"  # 64 x 65536 x 4 = 16 MiB an answer
            answers = stub.ModelStreamInfer(iter([req] * 200))   # never read until the end
            # Read only once the server has cancelled it (its log says so; a loaded machine may be slow).
            log = os.path.join(d, "server.log")
            until = time.monotonic() + 60
            while time.monotonic() < until:
                with open(log, errors="replace") as f:
                    if "stream_cancelled" in f.read():
                        break
                time.sleep(0.1)
            with self.assertRaises(grpc.RpcError) as cm:
                for _ in answers:
                    pass
            self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
            small = kpb.ModelInferRequest(model_name="drafthead")
            small.inputs.add(name="hidden", datatype="FP32", shape=[1, 64])
            small.raw_input_contents.append(x[:1].tobytes())
            small.parameters["mode"].string_param = "argmax"
            self.assertEqual(len(stub.ModelInfer(small, timeout=TIMEOUT).outputs), 2)
        finally:
            server.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
