"""Shared helpers for the client's Python tests: child servers on free loopback ports, a small
safetensors reader/writer (independent of the client's C++ one, so each checks the other), and the
fake server's toy head in numpy."""

import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import numpy as np

BIN = os.environ.get("DRAFTHEAD_BIN_DIR", "build")
CLIENT = os.path.join(BIN, "client", "drafthead-client")
FAKE = os.path.join(BIN, "client", "drafthead-fake-server")


class Child:
    """A server child process that writes its port to --port-file (the fake server)."""

    def __init__(self, args, exit_after_s=240):
        self.dir = tempfile.mkdtemp(prefix="dh-client-test-")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen([FAKE, "--listen=127.0.0.1:0", f"--port-file={port_file}",
                                      f"--exit-after-s={exit_after_s}"] + list(args),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        self.port = 0
        while time.monotonic() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    self.port = int(f.read().strip())
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"fake server exited: {self.proc.stderr.read().decode()}")
            time.sleep(0.02)
        if not self.port:
            self.close()
            raise RuntimeError("fake server did not start")
        self.target = f"127.0.0.1:{self.port}"

    def close(self):
        if self.proc.stderr:
            self.proc.stderr.close()
        stop(self.proc, timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def stop(proc, timeout):
    """SIGTERM a child still running, SIGKILL it after `timeout` seconds; reaps it either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_GIVEN_PORTS = set()


def free_port():
    """A loopback port free now, never one this process was given before (the kernel may hand a
    closed port out again at once: two asked for in a row could otherwise be the same)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN_PORTS:
            _GIVEN_PORTS.add(port)
            return port


_ST_DTYPES = {"BF16": np.uint16, "F32": np.float32, "I32": np.int32, "U8": np.uint8}


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array)."""
    header, blobs, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr, dtype=_ST_DTYPES[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], np.frombuffer(data[8 + n + a:8 + n + b], dtype=_ST_DTYPES[t["dtype"]]).reshape(t["shape"]))
    return out


def bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def toy_logits(hidden_bits, vocab):
    """The fake server's head: y[m, n] = x[m, n mod K] * (1 + (n div K) / 4), in float32."""
    x = bf16_float(hidden_bits.reshape(-1, hidden_bits.shape[-1]))
    K = x.shape[1]
    n = np.arange(vocab)
    return (x[:, n % K] * (np.float32(1) + (n // K).astype(np.float32) * np.float32(0.25))).astype(np.float32)


def set_param(params, name, value):
    """One KServe InferParameter, as the clients map Python / C++ values: bool, int64, double, string."""
    p = params[name]
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = value


def infer_request(model, array, params=None, outputs=(), request_id="", datatype="BF16", raw=None):
    """A ModelInferRequest as the KServe clients build one: `array` the one input "hidden" (its raw
    bytes, or `raw` in their place), request parameters, the outputs asked for by name."""
    from drafthead_client._gen.inference import grpc_service_pb2 as kpb
    req = kpb.ModelInferRequest(model_name=model, id=request_id)
    req.inputs.add(name="hidden", datatype=datatype, shape=list(array.shape))
    req.raw_input_contents.append(raw if raw is not None else array.tobytes())
    for name, value in (params or {}).items():
        set_param(req.parameters, name, value)
    for name in outputs:
        req.outputs.add(name=name)
    return req


def kserve_tensors(resp):
    """A ModelInferResponse's outputs, name -> numpy array, as tritonclient's as_numpy reads
    raw_output_contents."""
    dtypes = {"INT32": np.int32, "FP32": np.float32, "BF16": np.uint16}
    return {o.name: np.frombuffer(resp.raw_output_contents[i], dtype=dtypes[o.datatype]).reshape(o.shape)
            for i, o in enumerate(resp.outputs)}


class RealServer:
    """drafthead-server (CPU, synthetic weights) as a child on a free loopback port, serving once
    `drafthead-client info --wait` says so; `args` are its flags beyond --listen."""

    def __init__(self, args, log_dir):
        self.target = f"127.0.0.1:{free_port()}"
        self.log = open(os.path.join(log_dir, "server.log"), "w")
        self.proc = subprocess.Popen([os.path.join(BIN, "server", "drafthead-server"), f"--listen={self.target}"]
                                     + list(args), stdout=self.log, stderr=subprocess.STDOUT)
        # Connect only once the port listens: an early refusal puts gRPC's channel into seconds of
        # reconnect backoff.
        deadline = time.monotonic() + 120
        while self.proc.poll() is None and time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", int(self.target.rsplit(":", 1)[1]))) == 0:
                    break
            time.sleep(0.02)
        p = subprocess.run([CLIENT, "info", f"--target={self.target}", "--wait=120"], capture_output=True,
                           text=True, timeout=150)
        if p.returncode != 0:
            self.close()
            raise RuntimeError(f"server did not serve: {p.stderr}")

    def close(self):
        stop(self.proc, timeout=30)
        self.log.close()


class RealServerTestCase(unittest.TestCase):
    """A test class sharing one RealServer started with SERVER_ARGS: `target` names it, `head` is a
    drafthead_client.RemoteDraftHead on it, `dir` a scratch directory."""
    SERVER_ARGS: list = []

    @classmethod
    def setUpClass(cls):
        import drafthead_client
        cls.dir = tempfile.mkdtemp(prefix="dh-server-")
        cls.server = RealServer(cls.SERVER_ARGS, cls.dir)
        cls.target = cls.server.target
        cls.head = drafthead_client.RemoteDraftHead(cls.target, timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
