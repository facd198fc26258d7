"""drafthead-client as a user runs it, against drafthead-fake-server on loopback: info (text, JSON,
--wait on health), logits (input dtypes, row ranges, bad input), and load's reports: the JSON
schema (docs/client.md), a well-formed self-contained HTML file, the CSV, a sweep, quiet output when
stderr is not a terminal. Every load run is bounded by -n and -z."""

import csv
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import CLIENT, Child, bf16_bits, read_safetensors, toy_logits, write_safetensors  # noqa: E402

K, V = 40, 260


def run(args, timeout=120, check=True):
    p = subprocess.run([CLIENT] + args, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{args}: exit {p.returncode}\n{p.stderr}")
    return p


class WellFormed(html.parser.HTMLParser):
    """Checks that every non-void element is closed in order; records what a report must not have."""
    VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}
    SVG_EMPTY_OK = {"rect", "line", "circle", "polyline", "path"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.tags, self.external = [], [], {}, []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for k, v in attrs:
            if k in ("src", "href") and v and ("://" in v or v.startswith("//")):
                self.external.append(v)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Child([f"--hidden-size={K}", f"--vocab-size={V}", "--max-rows=8"])
        cls.t = f"--target={cls.server.target}"
        cls.dir = tempfile.mkdtemp(prefix="dh-cli-test-")

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_info(self):
        p = run(["info", self.t])
        self.assertIn(f"hidden_size  {K}", p.stdout)
        j = json.loads(run(["info", self.t, "--json"]).stdout)
        self.assertEqual(j["vocab_size"], V)
        self.assertEqual(j["heads"], ["FP8_TWIN", "BF16_EXACT"])
        # Nothing listening: a clear failure, exit 1, within the wait.
        t0 = time.monotonic()
        p = run(["info", "--target=127.0.0.1:1", "--wait=1"], check=False)
        self.assertEqual(p.returncode, 1)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("not SERVING", p.stderr)

    def test_info_waits_for_serving(self):
        with Child(["--health-delay-ms=6000"]) as s:  # not over before a loaded machine's first check
            p = run(["info", f"--target={s.target}"], check=False)  # one check: not yet
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("health: ", p.stderr)  # not SERVING yet
            t0 = time.monotonic()
            run(["info", f"--target={s.target}", "--wait=20"])
            self.assertLess(time.monotonic() - t0, 25)

    def test_logits_f32_rows_and_modes(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((12, K)).astype(np.float32)
        hid = self.path("h32.safetensors")
        write_safetensors(hid, {"x": ("F32", x)})
        out = self.path("o.safetensors")
        run(["logits", self.t, f"--hidden={hid}", "--tensor=x", "--rows=2:11", "--mode=full", "--dtype=fp32", f"--out={out}"])
        got = read_safetensors(out)["logits"]
        self.assertEqual(got[0], "F32")
        np.testing.assert_array_equal(got[1], toy_logits(bf16_bits(x[2:11]), V))  # 9 rows: two calls of 8 + 1
        run(["logits", self.t, f"--hidden={hid}", "--tensor=x", "--mode=topk", "--k=3", f"--out={out}"])
        t = read_safetensors(out)
        self.assertEqual(set(t), {"token_ids", "values"})
        self.assertEqual(t["token_ids"][0], "I32")
        self.assertEqual(t["token_ids"][1].shape, (12, 3))
        np.testing.assert_array_equal(t["token_ids"][1][:, 0], toy_logits(bf16_bits(x), V).argmax(1))

    def test_fake_server_sync_api(self):
        # --api=sync (the gRPC floor's other server API): the same answers and the load tester's
        # unary calls; streams are not served there, and --delay-us is refused.
        with Child([f"--hidden-size={K}", f"--vocab-size={V}", "--max-rows=8", "--api=sync"]) as s:
            rng = np.random.default_rng(9)
            x = rng.standard_normal((3, K)).astype(np.float32)
            hid = self.path("hsync.safetensors")
            write_safetensors(hid, {"x": ("F32", x)})
            out = self.path("osync.safetensors")
            run(["logits", f"--target={s.target}", f"--hidden={hid}", "--tensor=x", "--mode=full", "--dtype=fp32",
                 f"--out={out}"])
            np.testing.assert_array_equal(read_safetensors(out)["logits"][1], toy_logits(bf16_bits(x), V))
            j = self.path("sync.json")
            run(["load", f"--target={s.target}", "--rows=2", "--mode=argmax", "-n", "50", "-z", "20s",
                 f"--json={j}", "--quiet"])
            r = json.load(open(j))["runs"][0]
            self.assertEqual((r["ok"], r["errors"]), (50, 0))
            j2 = self.path("sync_stream.json")
            run(["load", f"--target={s.target}", "--rows=2", "--mode=argmax", "--stream", "-n", "5", "-z", "20s",
                 f"--json={j2}", "--quiet"], check=False)
            self.assertEqual(json.load(open(j2))["runs"][0]["ok"], 0)  # StreamLogits: UNIMPLEMENTED
        from client_test_util import FAKE
        p = subprocess.run([FAKE, "--api=sync", "--delay-us=10"], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--delay-us needs --api=callback", p.stderr)

    def test_logits_bad_input(self):
        bad = self.path("bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad}   ")
        p = run(["logits", self.t, f"--hidden={bad}", "--tensor=x", f"--out={self.path('o2.safetensors')}"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("not valid JSON", p.stderr)
        ok = self.path("ok.safetensors")
        write_safetensors(ok, {"x": ("BF16", np.zeros((2, K + 1), np.uint16))})
        p = run(["logits", self.t, f"--hidden={ok}", "--tensor=x", f"--out={self.path('o2.safetensors')}"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("hidden size", p.stderr)
        p = run(["logits", self.t, f"--hidden={ok}", "--tensor=nope", f"--out={self.path('o2.safetensors')}"], check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no tensor \"nope\"", p.stderr)
        p = run(["frobnicate", self.t], check=False)
        self.assertEqual(p.returncode, 2)

    def check_report(self, j, runs):
        self.assertEqual(j["schema_version"], 1)
        self.assertEqual(j["tool"], "drafthead-client load")
        self.assertEqual(j["server"]["hidden_size"], K)
        for key in ("target", "loop", "concurrency", "rps", "rows", "mode", "stream", "connections", "hidden"):
            self.assertIn(key, j["config"])
        self.assertEqual(len(j["runs"]), runs)
        for r in j["runs"]:
            for key, typ in (("loop", str), ("concurrency", int), ("elapsed_s", (int, float)), ("issued", int),
                             ("answered", int), ("ok", int), ("errors", int), ("errors_by_code", dict),
                             ("requests_per_s", (int, float)), ("rows_per_s", (int, float)), ("latency_us", dict),
                             ("server_us", dict), ("batch_rows_p50", (int, float)), ("latency_histogram", list),
                             ("timeline", list)):
                self.assertIsInstance(r[key], typ, key)
            lat = r["latency_us"]
            self.assertLessEqual(lat["min"], lat["p50"])
            self.assertLessEqual(lat["p50"], lat["p90"])
            self.assertLessEqual(lat["p90"], lat["p99"])
            self.assertLessEqual(lat["p99"], lat["p999"])
            self.assertLessEqual(lat["p999"], lat["max"])
            self.assertEqual(sum(b["count"] for b in r["latency_histogram"]), r["ok"])
            self.assertEqual(sum(b["ok"] for b in r["timeline"]), r["ok"])
            # Every stage measured in every OK answer (no step here is untimed: no CUDA server).
            self.assertEqual(len(r["server_stages_us"]), 9)
            for name, st in r["server_stages_us"].items():
                self.assertEqual(st["count"], r["ok"], name)

    def test_load_reports(self):
        js, ht, cs = self.path("l.json"), self.path("l.html"), self.path("l.csv")
        p = run(["load", self.t, "-c", "4", "-n", "300", "-z", "20s", "--mode=topk", "--k=4", "--connections=2",
                 f"--json={js}", f"--html={ht}", f"--csv={cs}"])
        self.assertEqual(p.stderr, "")  # no progress line when stderr is not a terminal
        self.assertIn("latency us", p.stdout)
        with open(js) as f:
            j = json.load(f)
        self.check_report(j, 1)
        r = j["runs"][0]
        self.assertEqual((r["issued"], r["ok"], r["errors"]), (300, 300, 0))
        self.assertEqual(r["batch_rows_p50"], 5)
        with open(cs) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 300)
        self.assertEqual({x["status"] for x in rows}, {"OK"})
        with open(ht) as f:
            page = f.read()
        w = WellFormed()
        w.feed(page)
        w.close()
        self.assertEqual(w.errors, [])
        self.assertEqual(w.stack, [])
        self.assertEqual(w.external, [])
        self.assertNotIn("script", w.tags)
        self.assertGreaterEqual(w.tags.get("svg", 0), 4)
        self.assertTrue(page.startswith("<!DOCTYPE html>"))

    def test_load_open_loop_stream_and_sweep(self):
        js, ht = self.path("s.json"), self.path("s.html")
        run(["load", self.t, "--sweep=1,2,4", "-n", "100", "-z", "10s", "--mode=argmax", "--quiet",
             f"--json={js}", f"--html={ht}"])
        with open(js) as f:
            j = json.load(f)
        self.check_report(j, 3)
        self.assertTrue(j["sweep"])
        self.assertEqual([r["concurrency"] for r in j["runs"]], [1, 2, 4])
        with open(ht) as f:
            page = f.read()
        w = WellFormed()
        w.feed(page)
        self.assertEqual(w.errors, [])
        self.assertIn("Concurrency sweep", page)
        # Open loop on streams, Poisson arrivals, from a hidden-state file.
        hid = self.path("hl.safetensors")
        write_safetensors(hid, {"h": ("BF16", bf16_bits(np.random.default_rng(2).standard_normal((7, K))))})
        run(["load", self.t, "--stream", "--rps=300", "--arrival=poisson", "-z", "1s", "--warmup=200ms", "--rows=3",
             f"--hidden={hid}", "--tensor=h", "--mode=sample", "--temperature=0.7", "--quiet", f"--json={js}"], timeout=60)
        with open(js) as f:
            j = json.load(f)
        self.check_report(j, 1)
        r = j["runs"][0]
        self.assertEqual(r["loop"], "open")
        self.assertEqual(r["errors"], 0)
        self.assertGreater(r["ok"], 200)
        self.assertLess(r["ok"], 400)
        self.assertEqual(j["config"]["hidden"], f"{hid}:h")

    def test_tls_and_mtls(self):
        if not shutil.which("openssl"):
            self.skipTest("openssl not installed")
        d = tempfile.mkdtemp(prefix="dh-tls-", dir=self.dir)
        f = lambda n: os.path.join(d, n)  # noqa: E731

        def ossl(*a):
            subprocess.run(["openssl"] + list(a), check=True, capture_output=True, timeout=60)

        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f("ca.key"), "-out", f("ca.pem"), "-days", "2",
             "-subj", "/CN=drafthead test CA")
        for name, ext in (("srv", "subjectAltName=DNS:drafthead.test\nextendedKeyUsage=serverAuth"),
                          ("cli", "extendedKeyUsage=clientAuth")):
            with open(f(name + ".ext"), "w") as e:
                e.write(ext + "\n")
            ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f(name + ".key"), "-out", f(name + ".csr"),
                 "-subj", f"/CN={name}")
            ossl("x509", "-req", "-in", f(name + ".csr"), "-CA", f("ca.pem"), "-CAkey", f("ca.key"), "-CAcreateserial",
                 "-out", f(name + ".pem"), "-days", "2", "-extfile", f(name + ".ext"))
        tls = [f"--tls-ca={f('ca.pem')}", "--tls-server-name=drafthead.test"]
        mtls = tls + [f"--tls-cert={f('cli.pem')}", f"--tls-key={f('cli.key')}"]
        with Child([f"--hidden-size={K}", f"--tls-cert={f('srv.pem')}", f"--tls-key={f('srv.key')}"]) as s:
            t = f"--target={s.target}"
            self.assertIn(f"hidden_size  {K}", run(["info", t] + tls).stdout)
            self.assertEqual(run(["info", t, "--timeout=3s"], check=False).returncode, 1)  # plaintext to a TLS port
            js = self.path("tls.json")
            run(["load", t, "-n", "50", "-c", "2", "--quiet", f"--json={js}"] + tls)
            with open(js) as fh:
                self.assertEqual(json.load(fh)["runs"][0]["ok"], 50)
        with Child([f"--hidden-size={K}", f"--tls-cert={f('srv.pem')}", f"--tls-key={f('srv.key')}",
                    f"--tls-client-ca={f('ca.pem')}"]) as s:
            t = f"--target={s.target}"
            self.assertEqual(run(["info", t, "--timeout=3s"] + tls, check=False).returncode, 1)  # no client cert
            run(["info", t] + mtls)
            import drafthead_client as dc
            h = dc.RemoteDraftHead(s.target, root_ca=f("ca.pem"), cert=f("cli.pem"), key=f("cli.key"),
                                   server_name="drafthead.test")
            self.assertEqual(h.info()["hidden_size"], K)
            h.close()

    def test_load_refuses_a_bad_request_before_running(self):
        p = run(["load", self.t, "-n", "10", "--rows=100"], check=False)  # max_rows is 8
        self.assertEqual(p.returncode, 1)
        self.assertIn("probe request", p.stderr)
        self.assertIn("rows", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
