"""drafthead_client.dspark_adapter against a stand-in for sglang's deepseek_v4_dspark (the same
class, method and function names) and a real CPU drafthead-server started with
--shared-memory=system. The adapter's logic (arming, drift refusal, row and sharding limits, the
stock fallback logged once when the server is unreachable or serves no CUDA regions) runs with a
numpy transport through POSIX regions, so it is tested without torch; the CUDA transport itself
needs torch and a GPU (bench/gpu/regions.sh runs it) and is skipped here with a message when
they are absent. About 3 s."""

import contextlib
import io
import os
import sys
import types
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import RealServerTestCase, bf16_bits, free_port  # noqa: E402

import drafthead_client as dc  # noqa: E402
from drafthead_client import dspark_adapter  # noqa: E402
from drafthead_client.regions import SystemRegion  # noqa: E402

K, PADDED, VOCAB = 256, 4096, 4000


def stand_in_module():
    """sglang.srt.models.deepseek_v4_dspark as far as the adapter sees it; numpy for tensors."""
    mod = types.ModuleType("deepseek_v4_dspark")

    class Stage:
        def norm(self, x):
            return x * np.float32(0.5)

    class DeepseekV4ForCausalLMDSpark:
        _opt_markov_w2_tp_shard = False

        def __init__(self):
            self.stages = [Stage()]
            self.lm_head = types.SimpleNamespace(weight=np.zeros((1, K), dtype=np.uint16))
            self.stock_calls = 0

        def attach_shared_modules(self, *a, **kw):
            return None

        def _logits_from_x_post_hc(self, x_post_hc):
            self.stock_calls += 1
            return ("stock", x_post_hc.shape[0])

    mod.DeepseekV4ForCausalLMDSpark = DeepseekV4ForCausalLMDSpark
    mod.gather_and_crop_vocab = lambda local, lm_head: local
    return mod


class NumpyRegionTransport:
    """The CUDA transport's part played with numpy arrays in one POSIX region."""

    def __init__(self, head, info):
        self.head, self.k, self.vocab = head, info["hidden_size"], info["vocab_size"]
        m = dspark_adapter.MAX_M
        self.region = SystemRegion(head, f"dspark-test.{os.getpid()}", m * (self.k + self.vocab) * 2)
        self.hid = self.region.ndarray((m, self.k), np.uint16)
        self.out = self.region.ndarray((m, self.vocab), np.uint16, offset=self.hid.nbytes)

    def logits(self, x, out_dtype):
        m = x.shape[0]
        self.hid[:m] = bf16_bits(x)
        self.head.compute_in_regions("full", m, self.region.slice_of(self.hid[:m]),
                                     logits_region=self.region.slice_of(self.out[:m]))
        return self.out[:m].astype(out_dtype, copy=True)


class DSparkAdapterTest(RealServerTestCase):
    SERVER_ARGS = ["--synthetic=2", f"--hidden-size={K}", f"--padded-vocab={PADDED}", f"--vocab-size={VOCAB}", "--tp=1",
                   "--threads=1", "--shared-memory=system"]

    def test_refuses_to_arm_on_a_drifted_engine(self):
        for broken in ("_logits_from_x_post_hc", "gather_and_crop_vocab", "DeepseekV4ForCausalLMDSpark"):
            mod = stand_in_module()
            if broken == "_logits_from_x_post_hc":
                del mod.DeepseekV4ForCausalLMDSpark._logits_from_x_post_hc
            else:
                delattr(mod, broken)
            with self.assertRaisesRegex(RuntimeError, f"{broken} is gone; engine drifted"):
                dspark_adapter.install(mod, target=self.target, make_transport=NumpyRegionTransport)

    def test_off_without_a_target(self):
        mod = stand_in_module()
        stock = mod.DeepseekV4ForCausalLMDSpark._logits_from_x_post_hc
        self.assertIsNone(dspark_adapter.install(mod, target=""))
        self.assertIs(mod.DeepseekV4ForCausalLMDSpark._logits_from_x_post_hc, stock)

    def test_the_server_answers_the_draft_head_like_the_bytes_path(self):
        mod = stand_in_module()
        with contextlib.redirect_stderr(io.StringIO()) as err:
            dspark_adapter.install(mod, target=self.target, make_transport=NumpyRegionTransport)
        self.assertIn("armed", err.getvalue())
        # Installing twice keeps the first arming.
        armed = mod.DeepseekV4ForCausalLMDSpark._logits_from_x_post_hc
        dspark_adapter.install(mod, target=self.target, make_transport=NumpyRegionTransport)
        self.assertIs(mod.DeepseekV4ForCausalLMDSpark._logits_from_x_post_hc, armed)
        model = mod.DeepseekV4ForCausalLMDSpark()
        rng = np.random.default_rng(5)
        for m in (1, 5, 64):
            x = rng.standard_normal((m, K)).astype(np.float32)
            y = model._logits_from_x_post_hc(x)
            self.assertEqual(y.shape, (m, VOCAB))
            self.assertEqual(y.dtype, model.lm_head.weight.dtype)
            want = self.head.logits(bf16_bits(x * np.float32(0.5)))  # the stage's norm, then the head
            np.testing.assert_array_equal(y, want)
        self.assertEqual(model.stock_calls, 0)
        # What the server does not answer goes to the stock path.
        self.assertEqual(model._logits_from_x_post_hc(np.zeros((65, K), np.float32)), ("stock", 65))
        model._opt_markov_w2_tp_shard = True
        self.assertEqual(model._logits_from_x_post_hc(np.zeros((5, K), np.float32)), ("stock", 5))

    def test_an_unreachable_server_falls_back_to_the_stock_path_logged_once(self):
        mod = stand_in_module()
        dead = f"127.0.0.1:{free_port()}"
        with contextlib.redirect_stderr(io.StringIO()) as err:
            remote = dspark_adapter.install(mod, target=dead, make_transport=NumpyRegionTransport)
            model = mod.DeepseekV4ForCausalLMDSpark()
            for _ in range(3):
                self.assertEqual(model._logits_from_x_post_hc(np.zeros((5, K), np.float32)), ("stock", 5))
                remote.down_until = 0  # retry at once: each call tries the server again
        self.assertEqual(err.getvalue().count("unreachable"), 1, err.getvalue())
        self.assertEqual(model.stock_calls, 3)

    def test_a_server_without_cuda_regions_is_refused_by_the_cuda_transport(self):
        mod = stand_in_module()
        with contextlib.redirect_stderr(io.StringIO()) as err:
            dspark_adapter.install(mod, target=self.target)  # the default: CUDA regions
            model = mod.DeepseekV4ForCausalLMDSpark()
            self.assertEqual(model._logits_from_x_post_hc(np.zeros((5, K), np.float32)), ("stock", 5))
        self.assertIn("--shared-memory=cuda", err.getvalue())


if __name__ == "__main__":
    unittest.main()
