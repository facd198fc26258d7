#!/usr/bin/python3
"""Interoperability check, run by hand where Triton's Python client is installed (it is not on the
build machines: no PyPI there). tritonclient.grpc against drafthead-server's KServe v2 service,
every answer compared bit for bit with drafthead's native Python client (drafthead.v1).

  pip install 'tritonclient[grpc]'        # or, from its sources: tests/interop/build_triton_clients.sh
                                          # SRC OUT puts it with stubs from Triton's .proto files in
                                          # OUT/python (add OUT/python to PYTHONPATH below)
  build/server/drafthead-server --tp=1 --backend=cpu --comm=gloo --synthetic=1 --hidden-size=256 \
      --padded-vocab=2048 --shared-memory=system --listen=127.0.0.1:PORT &
  PORT=PORT build/client/python/venv/bin/python tests/interop/tritonclient_check.py   # the drafthead_client wheel installed

Prints PASS/FAIL per check; exit 1 if any failed. Last run: docs/client.md ("KServe v2 / Triton").
"""
import os
import sys
import threading
import queue
import traceback


import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils as tu
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException
from drafthead_client import RemoteDraftHead, bf16_to_float32

TARGET = "127.0.0.1:" + os.environ.get("PORT", "51377")
MODEL = "drafthead"
ROWS, K, V = 5, 256, 2048

results = []  # (name, ok, detail)


def check(name):
    def deco(fn):
        try:
            detail = fn()
            results.append((name, True, detail or ""))
        except Exception as e:  # noqa: BLE001
            tb = traceback.format_exc(limit=3)
            results.append((name, False, f"{type(e).__name__}: {e}\n{tb}"))
        return fn
    return deco


def same_bits(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    assert a.dtype.itemsize == b.dtype.itemsize, f"{what}: dtype {a.dtype} vs {b.dtype}"
    assert a.tobytes() == b.tobytes(), f"{what}: bytes differ ({np.sum(a != b)} elements)"


c = grpcclient.InferenceServerClient(TARGET)
native = RemoteDraftHead(TARGET)
native.wait_until_serving(30)
rng = np.random.default_rng(7)
x = rng.standard_normal((ROWS, K)).astype(np.float32)


def fp32_input(arr=x):
    i = grpcclient.InferInput("hidden", list(arr.shape), "FP32")
    i.set_data_from_numpy(arr)
    return i


def outs(*names):
    return [grpcclient.InferRequestedOutput(n) for n in names]


# ---------------------------------------------------------------- health / metadata
@check("is_server_live / is_server_ready / is_model_ready")
def _():
    assert c.is_server_live() is True
    assert c.is_server_ready() is True
    assert c.is_model_ready(MODEL) is True
    assert c.is_model_ready(MODEL, "1") is True
    try:
        r = c.is_model_ready("no_such_model")
        return f"unknown model -> {r!r}"
    except InferenceServerException as e:
        return f"unknown model -> raises {e.status()} {e.message()!r}"


@check("get_server_metadata")
def _():
    m = c.get_server_metadata()
    j = c.get_server_metadata(as_json=True)
    assert m.name and m.version, m
    return f"name={m.name!r} version={m.version!r} extensions={list(m.extensions)}"


@check("get_model_metadata")
def _():
    m = c.get_model_metadata(MODEL)
    c.get_model_metadata(MODEL, as_json=True)
    assert m.name == MODEL
    ins = [(t.name, t.datatype, list(t.shape)) for t in m.inputs]
    outs_ = [(t.name, t.datatype, list(t.shape)) for t in m.outputs]
    assert ins and ins[0][0] == "hidden", ins
    return f"versions={list(m.versions)} platform={m.platform!r} inputs={ins} outputs={outs_}"


@check("get_model_config")
def _():
    r = c.get_model_config(MODEL)
    c.get_model_config(MODEL, as_json=True)
    cfg = r.config
    assert cfg.name == MODEL
    return (f"platform={cfg.platform!r} backend={cfg.backend!r} max_batch_size={cfg.max_batch_size} "
            f"inputs={[(i.name, i.data_type, list(i.dims)) for i in cfg.input]} "
            f"outputs={[(o.name, o.data_type, list(o.dims)) for o in cfg.output]}")


# ---------------------------------------------------------------- inference, FP32 input
@check("infer full_logits, logits_dtype FP32 == native (bitwise)")
def _():
    r = c.infer(MODEL, [fp32_input()], outputs=outs("logits"),
                parameters={"mode": "full_logits", "logits_dtype": "FP32"})
    got = r.as_numpy("logits")
    assert r.get_output("logits").datatype == "FP32"
    ref = native.logits(x, dtype="fp32")
    same_bits(got, ref, "logits")
    p = r.get_response().parameters
    return f"shape {got.shape}; response params {sorted(p.keys())}"


@check("infer full_logits default (BF16 logits) == native (bitwise)")
def _():
    r = c.infer(MODEL, [fp32_input()], parameters={"mode": "full_logits"})
    out = r.get_output("logits")
    assert out.datatype == "BF16", out.datatype
    got = r.as_numpy("logits")  # tritonclient widens bf16 to float32
    ref = native.logits(x)      # native: float32 input, bf16 logits widened to float32
    same_bits(got, ref, "logits")
    raw = np.frombuffer(r.get_response().raw_output_contents[0], dtype="<u2").reshape(ROWS, V)
    same_bits(raw, (ref.view(np.uint32) >> 16).astype(np.uint16), "raw bf16 bits")
    return f"shape {got.shape}"


@check("infer top_k (k=8, return_probs, temperature 0.8) == native")
def _():
    r = c.infer(MODEL, [fp32_input()], outputs=outs("token_ids", "values", "probs"),
                parameters={"mode": "top_k", "top_k": 8, "return_probs": True, "temperature": 0.8})
    ref = native.topk(x, 8, probs=True, temperature=0.8)
    assert r.get_output("token_ids").datatype == "INT32"
    same_bits(r.as_numpy("token_ids"), ref.ids if hasattr(ref, "ids") else ref[0], "token_ids")
    same_bits(r.as_numpy("values"), ref[1], "values")
    same_bits(r.as_numpy("probs"), ref[2], "probs")
    return f"token_ids shape {r.as_numpy('token_ids').shape}"


@check("infer argmax == native")
def _():
    r = c.infer(MODEL, [fp32_input()], outputs=outs("token_ids", "values"),
                parameters={"mode": "argmax"})
    ref = native.argmax(x)
    same_bits(r.as_numpy("token_ids").reshape(-1), ref[0].reshape(-1), "token_ids")
    same_bits(r.as_numpy("values").reshape(-1), ref[1].reshape(-1), "values")
    return f"token_ids shape {r.as_numpy('token_ids').shape} (native {ref[0].shape})"


@check("infer sample (temperature 0.7, seed 12345) == native")
def _():
    r = c.infer(MODEL, [fp32_input()], outputs=outs("token_ids", "values"),
                parameters={"mode": "sample", "temperature": 0.7, "seed": 12345})
    ref = native.sample(x, temperature=0.7, seed=12345)
    same_bits(r.as_numpy("token_ids").reshape(-1), ref[0].reshape(-1), "token_ids")
    same_bits(r.as_numpy("values").reshape(-1), ref[1].reshape(-1), "values")
    r2 = c.infer(MODEL, [fp32_input()], parameters={"mode": "sample", "temperature": 0.7, "seed": 12346})
    return f"ids {r.as_numpy('token_ids').reshape(-1).tolist()}; seed+1 -> {r2.as_numpy('token_ids').reshape(-1).tolist()}"


@check("infer with no outputs= (all outputs of the mode)")
def _():
    r = c.infer(MODEL, [fp32_input()], parameters={"mode": "top_k", "top_k": 4})
    names = [o.name for o in r.get_response().outputs]
    return f"top_k answers {names}"


@check("output selection: order kept, logits of a top_k request left out")
def _():
    r = c.infer(MODEL, [fp32_input()], outputs=outs("values", "logits", "token_ids"),
                parameters={"mode": "top_k", "top_k": 3})
    names = [o.name for o in r.get_response().outputs]
    assert names == ["values", "token_ids"], names
    assert r.as_numpy("logits") is None
    return f"answered {names}"


# ---------------------------------------------------------------- BF16 input
@check("BF16 input (tritonclient serialize_bf16_tensor) == native bf16 bits")
def _():
    i = grpcclient.InferInput("hidden", [ROWS, K], "BF16")
    i.set_data_from_numpy(x)  # tritonclient: float32 array, truncated to bf16
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation, as tritonclient does
    assert i._get_content() == bits.tobytes(), "tritonclient's BF16 bytes are not the truncated bits"
    r = c.infer(MODEL, [i], parameters={"mode": "full_logits", "logits_dtype": "FP32"})
    same_bits(r.as_numpy("logits"), native.logits(bits, dtype="fp32"), "logits")
    r = c.infer(MODEL, [i], parameters={"mode": "top_k", "top_k": 5, "return_probs": True})
    ref = native.topk(bits, 5, probs=True)
    same_bits(r.as_numpy("token_ids"), ref[0], "token_ids")
    same_bits(r.as_numpy("values"), ref[1], "values")
    same_bits(r.as_numpy("probs"), ref[2], "probs")
    r = c.infer(MODEL, [i], parameters={"mode": "full_logits"})
    same_bits(r.as_numpy("logits"), bf16_to_float32(native.logits(bits)), "bf16 logits")
    return "full (FP32 and BF16 logits) and top_k match"


# ---------------------------------------------------------------- async unary
@check("async_infer (callback)")
def _():
    q = queue.Queue()
    c.async_infer(MODEL, [fp32_input()], callback=lambda result, error: q.put((result, error)),
                  parameters={"mode": "argmax"})
    res, err = q.get(timeout=30)
    assert err is None, err
    same_bits(res.as_numpy("token_ids").reshape(-1), native.argmax(x)[0].reshape(-1), "token_ids")
    return "ok"


# ---------------------------------------------------------------- errors
def expect_error(fn, code, prefix):
    try:
        fn()
    except InferenceServerException as e:
        assert e.status() == code, f"status {e.status()} message {e.message()!r}"
        assert e.message().startswith(prefix), f"message {e.message()!r}"
        return f"{e.status()} {e.message()!r}"
    raise AssertionError("no error")


@check("errors: bad shape / unknown parameter / unknown output / unknown model")
def _():
    bad = rng.standard_normal((ROWS, K - 1)).astype(np.float32)
    out = [expect_error(lambda: c.infer(MODEL, [fp32_input(bad)]), "StatusCode.INVALID_ARGUMENT", "hidden"),
           expect_error(lambda: c.infer(MODEL, [fp32_input()], parameters={"bogus": 1}),
                        "StatusCode.INVALID_ARGUMENT", "parameters"),
           expect_error(lambda: c.infer(MODEL, [fp32_input()], outputs=outs("nope")),
                        "StatusCode.INVALID_ARGUMENT", ""),
           expect_error(lambda: c.infer("nope", [fp32_input()]), "StatusCode.NOT_FOUND", "")]
    return "; ".join(out)


@check("tritonclient's own request parameters: priority=, timeout= (infer kwargs)")
def _():
    want = native.argmax(x)[0].reshape(-1)
    for kw in ({"priority": 1}, {"timeout": 1000000}):
        r = c.infer(MODEL, [fp32_input()], parameters={"mode": "argmax"}, **kw)
        same_bits(r.as_numpy("token_ids").reshape(-1), want, f"token_ids with {kw}")
    return "accepted, answers equal the native ones"


# ---------------------------------------------------------------- streaming
@check("start_stream / async_stream_infer with a bad request in the middle")
def _():
    got = []
    done = threading.Event()

    def cb(result, error):
        got.append((result, error))
        if len(got) == 3:
            done.set()

    c.start_stream(callback=cb)
    bad = rng.standard_normal((ROWS, K - 1)).astype(np.float32)
    c.async_stream_infer(MODEL, [fp32_input()], request_id="r1", parameters={"mode": "argmax"})
    c.async_stream_infer(MODEL, [fp32_input(bad)], request_id="r2", parameters={"mode": "argmax"})
    c.async_stream_infer(MODEL, [fp32_input()], request_id="r3", outputs=outs("token_ids", "values", "probs"),
                         parameters={"mode": "top_k", "top_k": 8, "return_probs": True, "temperature": 0.8})
    assert done.wait(30), f"only {len(got)} answers"
    c.stop_stream()
    # answers strictly in request order, the refused one in its place (issue 20); tritonclient hands
    # an in-band error to the callback as InferenceServerException(msg) only.
    order = [("error" if e is not None else r.get_response().id) for r, e in got]
    oks = {r.get_response().id: r for r, e in got if e is None}
    errs = [e for r, e in got if e is not None]
    assert order == ["r1", "error", "r3"], order
    r1, r3, e2 = oks["r1"], oks["r3"], errs[0]
    same_bits(r1.as_numpy("token_ids").reshape(-1), native.argmax(x)[0].reshape(-1), "r1 token_ids")
    ref = native.topk(x, 8, probs=True, temperature=0.8)
    same_bits(r3.as_numpy("token_ids"), ref[0], "r3 token_ids")
    same_bits(r3.as_numpy("probs"), ref[2], "r3 probs")
    return f"arrival order {order}; r2 error {e2.message()!r} (status {e2.status()}); stream went on"


# ---------------------------------------------------------------- system shared memory
@check("system shared memory (tritonclient.utils.shared_memory): input + logits / token_ids / values / probs")
def _():
    pid = os.getpid()
    in_bytes = ROWS * K * 4
    lg_bytes = ROWS * V * 4
    tk_bytes = ROWS * 8 * 4
    regs = {"in": ("/dhchk_in_%d" % pid, in_bytes), "lg": ("/dhchk_lg_%d" % pid, lg_bytes),
            "ids": ("/dhchk_ids_%d" % pid, tk_bytes), "val": ("/dhchk_val_%d" % pid, tk_bytes),
            "prb": ("/dhchk_prb_%d" % pid, tk_bytes)}
    c.unregister_system_shared_memory()
    h = {n: shm.create_shared_memory_region(n, key, size) for n, (key, size) in regs.items()}
    try:
        shm.set_shared_memory_region(h["in"], [x])
        for n, (key, size) in regs.items():
            c.register_system_shared_memory(n, key, size)
        st = c.get_system_shared_memory_status()
        names = sorted(r for r in st.regions)
        assert names == sorted(regs), names
        st1 = c.get_system_shared_memory_status("lg")
        assert st1.regions["lg"].byte_size == lg_bytes, st1

        i = grpcclient.InferInput("hidden", [ROWS, K], "FP32")
        i.set_shared_memory("in", in_bytes)
        o = grpcclient.InferRequestedOutput("logits")
        o.set_shared_memory("lg", lg_bytes)
        r = c.infer(MODEL, [i], outputs=[o], parameters={"mode": "full_logits", "logits_dtype": "FP32"})
        out = r.get_output("logits")
        # informational only (a proto map's [] would insert the key): does the answer echo the region?
        echoed = sorted(out.parameters.keys())
        assert len(r.get_response().raw_output_contents) in (0, 1)
        raw_len = [len(b) for b in r.get_response().raw_output_contents]
        got = shm.get_contents_as_numpy(h["lg"], tu.triton_to_np_dtype(out.datatype), list(out.shape))
        same_bits(got, native.logits(x, dtype="fp32"), "shm logits")

        os_ = []
        for name, reg in (("token_ids", "ids"), ("values", "val"), ("probs", "prb")):
            o = grpcclient.InferRequestedOutput(name)
            o.set_shared_memory(reg, tk_bytes)
            os_.append(o)
        r = c.infer(MODEL, [i], outputs=os_,
                    parameters={"mode": "top_k", "top_k": 8, "return_probs": True, "temperature": 0.8})
        ref = native.topk(x, 8, probs=True, temperature=0.8)
        for k_, (name, reg) in enumerate((("token_ids", "ids"), ("values", "val"), ("probs", "prb"))):
            out = r.get_output(name)
            got = shm.get_contents_as_numpy(h[reg], tu.triton_to_np_dtype(out.datatype), list(out.shape))
            same_bits(got, ref[k_], "shm " + name)

        # mixed: input in shm, outputs inline
        r = c.infer(MODEL, [i], parameters={"mode": "argmax"})
        same_bits(r.as_numpy("token_ids").reshape(-1), native.argmax(x)[0].reshape(-1), "shm-in argmax")

        # refusals
        errs = [expect_error(lambda: c.register_system_shared_memory("in", regs["in"][0], in_bytes),
                             "StatusCode.ALREADY_EXISTS", ""),
                expect_error(lambda: c.register_system_shared_memory("x", "/dhchk_missing_%d" % pid, 64),
                             "StatusCode.INVALID_ARGUMENT", "")]
        c.unregister_system_shared_memory("lg")
        assert "lg" not in c.get_system_shared_memory_status().regions
        c.unregister_system_shared_memory()
        assert len(c.get_system_shared_memory_status().regions) == 0
        return (f"input and all four outputs equal the native answers; logits output parameters in the answer: "
                f"{echoed}, raw_output_contents lengths {raw_len}; refusals: " + "; ".join(errs))
    finally:
        try:
            c.unregister_system_shared_memory()
        except Exception:  # noqa: BLE001
            pass
        for hh in h.values():
            shm.destroy_shared_memory_region(hh)


@check("statistics, repository index, unregister of unknown names (issue 20)")
def _():
    before = c.get_inference_statistics(MODEL).model_stats[0]
    for _ in range(3):
        c.infer(MODEL, [fp32_input()], parameters={"mode": "argmax"})
    after = c.get_inference_statistics(MODEL).model_stats[0]
    ok = after.inference_stats.success.count - before.inference_stats.success.count
    assert ok == 3 and after.inference_count - before.inference_count == 3, (before, after)
    assert after.inference_stats.compute_infer.count - before.inference_stats.compute_infer.count == 3
    index = c.get_model_repository_index().models
    assert [(m.name, m.state) for m in index] == [(MODEL, "READY")], index
    c.unregister_system_shared_memory("never_registered")  # tritonclient's clean-up habit: OK
    c.unregister_system_shared_memory()
    return (f"3 infers -> success +{ok}, executions +{after.execution_count - before.execution_count}, "
            f"queue ns +{after.inference_stats.queue.ns - before.inference_stats.queue.ns}")


@check("RPCs drafthead does not serve (informational: the error tritonclient raises)")
def _():
    notes = []
    for name, fn in (("get_trace_settings", lambda: c.get_trace_settings()),
                     ("get_log_settings", lambda: c.get_log_settings()),
                     ("get_cuda_shared_memory_status", lambda: c.get_cuda_shared_memory_status())):
        try:
            fn()
            notes.append(f"{name}: answered")
        except InferenceServerException as e:
            notes.append(f"{name}: {e.status()} {e.message()!r}")
    return "; ".join(notes)


# ---------------------------------------------------------------- asyncio client
@check("tritonclient.grpc.aio: is_server_ready + infer")
def _():
    import asyncio
    import tritonclient.grpc.aio as aioclient

    async def run():
        ac = aioclient.InferenceServerClient(TARGET)
        try:
            assert await ac.is_server_ready()
            i = aioclient.InferInput("hidden", [ROWS, K], "FP32")
            i.set_data_from_numpy(x)
            r = await ac.infer(MODEL, [i], parameters={"mode": "argmax"})
            return r.as_numpy("token_ids")
        finally:
            await ac.close()

    ids = asyncio.run(run())
    same_bits(ids.reshape(-1), native.argmax(x)[0].reshape(-1), "aio token_ids")
    return "ok"


c.close()
fails = 0
for name, ok, detail in results:
    print(("PASS " if ok else "FAIL ") + name)
    if detail:
        print("     " + detail.replace("\n", "\n     "))
    fails += not ok
print(f"\n{len(results) - fails}/{len(results)} passed")
sys.exit(1 if fails else 0)
