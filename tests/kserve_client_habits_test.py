"""Issue 20: the KServe v2 requests that the ecosystem's own clients send, byte for byte as they build
them, replayed against a real drafthead-server from Python's grpcio (stubs generated from
proto/inference/grpc_service.proto: a gRPC stack that is not the server's C++ one). One method per
habit, each answer compared with drafthead.v1's bit for bit. The server is the issue's: CPU, tp=3,
--shared-memory=system (tiny shapes). The clients themselves are not needed (nor installed here):

- Triton's C++ client library, so perf_analyzer in every mode: `triton_enable_empty_final_response`
  (bool) on every ModelInfer and ModelStreamInfer request, every output of the model requested,
  ModelStatistics around each measurement, `--request-parameter` values;
- the KServe Python SDK: `binary_data_size` (int64) beside the raw bytes (set_data_from_numpy), or
  typed `fp32_contents` (its list path), `binary_data` on requested outputs;
- tritonclient: SystemSharedMemoryUnregister of names it never registered (its clean-up);
- any streaming client: 24 requests on one ModelStreamInfer, the 5th malformed, answered in order.
"""

import os
import sys
import tempfile
import time
import unittest
from multiprocessing import shared_memory

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import RealServer, bf16_bits, infer_request, kserve_tensors, set_param  # noqa: E402

from drafthead_client import pb, pb_grpc  # noqa: E402
from drafthead_client._gen.inference import grpc_service_pb2 as kpb, grpc_service_pb2_grpc as kpb_grpc  # noqa: E402

K, PADDED, MAX_ROWS, MODEL = 128, 16384, 64, "drafthead"
TIMEOUT = 60
ALL_OUTPUTS = ("logits", "token_ids", "values", "probs")  # what perf_analyzer asks for


class ClientHabitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dh-kserve-habits-")
        cls.server = RealServer(["--synthetic=4", f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--tp=3",
                                 "--backend=cpu", "--comm=gloo", f"--max-rows={MAX_ROWS}",
                                 "--shared-memory=system",
                                 # Row 5 queues 24 x 64 rows on one stream at once: above the default
                                 # per-caller bound (1024 rows, issue 24), which would refuse the tail.
                                 "--max-caller-queue-rows=4096"], cls.dir)
        cls.channel = grpc.insecure_channel(cls.server.target)
        cls.kserve = kpb_grpc.GRPCInferenceServiceStub(cls.channel)
        cls.native = pb_grpc.DraftHeadStub(cls.channel)
        rng = np.random.default_rng(20)
        cls.x32 = rng.standard_normal((5, K)).astype(np.float32)
        cls.bits = bf16_bits(cls.x32)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.close()

    def native_answer(self, x32=None, **fields):
        x32 = self.x32 if x32 is None else x32
        return self.native.ComputeLogits(pb.LogitsRequest(rows=x32.shape[0], hidden=x32.tobytes(),
                                                          hidden_dtype=pb.FP32, **fields), timeout=TIMEOUT)

    def assert_topk_equal(self, got, n, k):
        np.testing.assert_array_equal(got["token_ids"], np.array(n.token_ids, np.int32).reshape(-1, k))
        self.assertEqual(got["values"].tobytes(), np.array(n.values, np.float32).tobytes())

    # ------------------------------------------------------------------ Triton's C++ client / perf_analyzer
    def perf_analyzer_request(self, x32, params, enable_final, request_id=""):
        """As triton::client::InferenceServerGrpcClient::PreRunProcessing builds it: the flag always
        set (true on perf_analyzer's streams), FP32 input as raw bytes, every output requested."""
        return infer_request(MODEL, x32, {"triton_enable_empty_final_response": enable_final, **params}, ALL_OUTPUTS,
                             request_id, datatype="FP32")

    def statistics(self):
        r = self.kserve.ModelStatistics(kpb.ModelStatisticsRequest(name=MODEL, version=""), timeout=TIMEOUT)
        self.assertEqual(len(r.model_stats), 1)
        return r.model_stats[0]

    def test_perf_analyzer_unary_every_mode(self):
        """Row 1: triton_enable_empty_final_response on ModelInfer, perf_analyzer's
        --request-parameter mode:top_k:string top_k:8:int, every output requested."""
        meta = self.kserve.ServerMetadata(kpb.ServerMetadataRequest(), timeout=TIMEOUT)
        self.assertIn("statistics", meta.extensions)
        cfg = self.kserve.ModelConfig(kpb.ModelConfigRequest(name=MODEL), timeout=TIMEOUT).config
        self.assertEqual(cfg.max_batch_size, 0)
        for enable in (False, True):
            resp = self.kserve.ModelInfer(self.perf_analyzer_request(self.x32, {"mode": "top_k", "top_k": 8}, enable),
                                          timeout=TIMEOUT)
            self.assertNotIn("triton_final_response", resp.parameters)  # unary: Triton sets it on streams only
            got = kserve_tensors(resp)
            self.assertEqual(sorted(got), ["token_ids", "values"])
            self.assert_topk_equal(got, self.native_answer(mode=pb.TOP_K, top_k=8), 8)
            got = kserve_tensors(self.kserve.ModelInfer(self.perf_analyzer_request(self.x32, {}, enable), timeout=TIMEOUT))
            self.assertEqual(got["logits"].tobytes(), self.native_answer().logits)
            got = kserve_tensors(self.kserve.ModelInfer(
                self.perf_analyzer_request(self.x32, {"mode": "sample", "temperature": 0.7, "seed": 11}, enable),
                timeout=TIMEOUT))
            self.assert_topk_equal(got, self.native_answer(mode=pb.SAMPLE, temperature=0.7, seed=11), 1)
        # The rest of Triton's reserved names, with Triton's types (sequence ids are ignored by a
        # model without a sequence batcher).
        req = self.perf_analyzer_request(self.x32, {"mode": "argmax", "sequence_id": 5, "sequence_start": True,
                                                    "sequence_end": False, "priority": 1, "timeout": 0}, True)
        self.assert_topk_equal(kserve_tensors(self.kserve.ModelInfer(req, timeout=TIMEOUT)),
                               self.native_answer(mode=pb.ARGMAX), 1)

    def test_perf_analyzer_streaming(self):
        """Row 1 on ModelStreamInfer: every answer carries triton_final_response = true when asked,
        and is the request's only answer (the model is not decoupled)."""
        want = self.native_answer(mode=pb.TOP_K, top_k=8)
        for enable in (True, False):
            reqs = [self.perf_analyzer_request(self.x32, {"mode": "top_k", "top_k": 8}, enable, f"p-{i}")
                    for i in range(6)]
            answers = list(self.kserve.ModelStreamInfer(iter(reqs), timeout=TIMEOUT))
            self.assertEqual([a.infer_response.id for a in answers], [f"p-{i}" for i in range(6)])
            for a in answers:
                self.assertEqual(a.error_message, "")
                if enable:
                    self.assertTrue(a.infer_response.parameters["triton_final_response"].bool_param)
                else:
                    self.assertNotIn("triton_final_response", a.infer_response.parameters)
                self.assert_topk_equal(kserve_tensors(a.infer_response), want, 8)

    def test_statistics_count_for_real(self):
        """perf_analyzer's server-side breakdown: ModelStatistics before and after a measurement."""
        before = self.statistics()
        n = 7
        for _ in range(n):
            self.kserve.ModelInfer(self.perf_analyzer_request(self.x32, {"mode": "argmax"}, False), timeout=TIMEOUT)
        self.native_answer(mode=pb.ARGMAX)  # the native API's requests are the model's too
        # Refused by the native validation (top_k past the limit): a failed inference.
        with self.assertRaises(grpc.RpcError):
            self.kserve.ModelInfer(self.perf_analyzer_request(self.x32, {"mode": "top_k", "top_k": 100000}, False),
                                   timeout=TIMEOUT)
        after = self.statistics()
        self.assertEqual((after.name, after.version), (MODEL, "1"))
        d = lambda f: getattr(after.inference_stats, f).count - getattr(before.inference_stats, f).count  # noqa: E731
        self.assertEqual(after.inference_count - before.inference_count, n + 1)
        self.assertEqual(d("success"), n + 1)
        self.assertEqual(d("fail"), 1)
        for f in ("queue", "compute_input", "compute_infer", "compute_output"):
            self.assertEqual(d(f), n + 1, f)
        self.assertGreater(after.inference_stats.success.ns, before.inference_stats.success.ns)
        self.assertGreater(after.inference_stats.compute_infer.ns, before.inference_stats.compute_infer.ns)
        executions = after.execution_count - before.execution_count
        self.assertTrue(1 <= executions <= n + 1, executions)
        self.assertEqual(sum(b.compute_infer.count for b in after.batch_stats), after.execution_count)
        self.assertGreaterEqual(after.last_inference, before.last_inference)
        self.assertGreater(after.last_inference, (time.time() - 600) * 1000)
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.ModelStatistics(kpb.ModelStatisticsRequest(name="other"), timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        index = self.kserve.RepositoryIndex(kpb.RepositoryIndexRequest(ready=True), timeout=TIMEOUT)
        self.assertEqual([(m.name, m.version, m.state) for m in index.models], [(MODEL, "1", "READY")])

    # ------------------------------------------------------------------ KServe Python SDK
    def test_kserve_sdk_binary_data_size(self):
        """Row 2: InferInput.set_data_from_numpy (binary_data=True, the default) puts
        binary_data_size (int64) in the input's parameters beside raw_input_contents;
        InferRequestedOutput sends binary_data (bool)."""
        req = kpb.ModelInferRequest(model_name=MODEL, id="5f0c6f2e-sdk")
        inp = req.inputs.add(name="hidden", datatype="FP32", shape=[5, K])
        raw = self.x32.tobytes()
        set_param(inp.parameters, "binary_data_size", len(raw))
        req.raw_input_contents.append(raw)
        set_param(req.parameters, "mode", "top_k")
        set_param(req.parameters, "top_k", 4)
        set_param(req.parameters, "return_probs", True)
        for name in ("token_ids", "values", "probs"):
            set_param(req.outputs.add(name=name).parameters, "binary_data", True)
        resp = self.kserve.ModelInfer(req, timeout=TIMEOUT)
        self.assertEqual(resp.id, "5f0c6f2e-sdk")
        got = kserve_tensors(resp)
        n = self.native_answer(mode=pb.TOP_K, top_k=4, return_probs=True)
        self.assert_topk_equal(got, n, 4)
        self.assertEqual(got["probs"].tobytes(), np.array(n.probs, np.float32).tobytes())

    def test_kserve_sdk_typed_contents(self):
        """Row 3: the SDK's list path (and any OIP client without raw bytes): contents.fp32_contents,
        read as the same values' raw bytes; typed plus raw for one input is INVALID_ARGUMENT."""
        req = kpb.ModelInferRequest(model_name=MODEL)
        inp = req.inputs.add(name="hidden", datatype="FP32", shape=[5, K])
        inp.contents.fp32_contents.extend(self.x32.ravel().tolist())
        got = kserve_tensors(self.kserve.ModelInfer(req, timeout=TIMEOUT))
        self.assertEqual(got["logits"].tobytes(), self.native_answer().logits)
        set_param(req.parameters, "mode", "argmax")
        self.assert_topk_equal(kserve_tensors(self.kserve.ModelInfer(req, timeout=TIMEOUT)),
                               self.native_answer(mode=pb.ARGMAX), 1)
        req.raw_input_contents.append(self.x32.tobytes())
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.ModelInfer(req, timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(e.exception.details().startswith("hidden: its values come from more than one"),
                        e.exception.details())
        # The same native validation as raw bytes: a non-finite value is named.
        del req.raw_input_contents[:]
        inp.contents.fp32_contents[3 * K + 2] = float("inf")
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.ModelInfer(req, timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(e.exception.details().startswith("hidden: non-finite value at row 3, column 2"),
                        e.exception.details())

    # ------------------------------------------------------------------ tritonclient
    def test_tritonclient_unregister_clean_up(self):
        """Row 4: unregister_system_shared_memory(name) of a name not registered is OK (Triton:
        nothing done), as is unregister-all; a registered region is still unregistered."""
        self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(name="never"), timeout=TIMEOUT)
        self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(), timeout=TIMEOUT)
        seg = shared_memory.SharedMemory(create=True, size=4096)
        try:
            self.kserve.SystemSharedMemoryRegister(kpb.SystemSharedMemoryRegisterRequest(
                name="r", key="/" + seg.name, byte_size=4096), timeout=TIMEOUT)
            self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(name="r"), timeout=TIMEOUT)
            self.kserve.SystemSharedMemoryUnregister(kpb.SystemSharedMemoryUnregisterRequest(name="r"), timeout=TIMEOUT)
            st = self.kserve.SystemSharedMemoryStatus(kpb.SystemSharedMemoryStatusRequest(), timeout=TIMEOUT)
            self.assertEqual(len(st.regions), 0)
        finally:
            seg.close()
            seg.unlink()
        # A kind the server runs without is still refused, naming the flag.
        with self.assertRaises(grpc.RpcError) as e:
            self.kserve.CudaSharedMemoryUnregister(kpb.CudaSharedMemoryUnregisterRequest(name="never"), timeout=TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    # ------------------------------------------------------------------ any streaming client
    def test_stream_answers_in_request_order(self):
        """Row 5: 24 requests on one stream, the 5th malformed: answered strictly in request order,
        the refused one in its place (in-band error_message, the id echoed). The valid ones cost
        compute (64 rows over the whole vocabulary) so that a refusal answered at once would overtake
        them (it did, before issue 20's fix, in most runs)."""
        x = np.random.default_rng(21).standard_normal((MAX_ROWS, K)).astype(np.float32)
        want = self.native_answer(x32=x, mode=pb.TOP_K, top_k=8)
        reqs = []
        for i in range(24):
            req = self.perf_analyzer_request(x, {"mode": "top_k", "top_k": 8}, True, f"s-{i}")
            if i == 4:
                set_param(req.parameters, "temperature", "hot")  # malformed: a string temperature
            reqs.append(req)
        answers = list(self.kserve.ModelStreamInfer(iter(reqs), timeout=TIMEOUT))
        self.assertEqual([a.infer_response.id for a in answers], [f"s-{i}" for i in range(24)])
        for i, a in enumerate(answers):
            self.assertTrue(a.infer_response.parameters["triton_final_response"].bool_param, i)
            if i == 4:
                self.assertTrue(a.error_message.startswith("INVALID_ARGUMENT: temperature:"), a.error_message)
            else:
                self.assertEqual(a.error_message, "", i)
                self.assert_topk_equal(kserve_tensors(a.infer_response), want, 8)
        # The server goes on serving.
        self.assert_topk_equal(kserve_tensors(self.kserve.ModelInfer(self.perf_analyzer_request(
            self.x32, {"mode": "argmax"}, False), timeout=TIMEOUT)), self.native_answer(mode=pb.ARGMAX), 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
