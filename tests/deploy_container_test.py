"""The CPU image built and run as in production (ctest label `container`), with podman, no daemon.

1. podman, runc and debootstrap from Debian's packages (installed here when missing and we are
   root); the test is skipped (exit 77, with the reason) only where this machine cannot run a
   container at all.
2. The base image is made locally: `debootstrap --variant=minbase bookworm` into a temporary folder,
   `podman import`ed as localhost/drafthead-base:bookworm. Nothing is pulled from any registry. The
   image (and a tarball of it in DRAFTHEAD_CONTAINER_CACHE) is reused for a week: it is only the
   FROM of both stages, which install their packages from the Debian mirror anyway.
3. `podman build --isolation=chroot --network=host --format docker --target cpu` of deploy/Dockerfile
   (--format docker keeps HEALTHCHECK and SHELL).
4. Run as production: the image's own user (10001, checked), its 4-rank group, synthetic weights;
   `podman --runtime runc --cgroup-manager=cgroupfs run --network=host --ulimit nofile=20000:20000
   --ulimit nproc=4096:4096` (crun and podman's default ulimits fail on these machines).
5. Health SERVING, the image's HEALTHCHECK passes, every mode answered identically by the same
   server outside the container (this build's drafthead-server, same flags).
6. `podman stop` under load from callers that stop sending once health says NOT_SERVING (as a load
   balancer does): exit code 0, no request failed.

Cost, measured on the 2-core CI machine (shared with other builds): 960 s in all, of which the
image build (the builder stage compiles the project from scratch) 947 s; the base image, when not
cached, ~3.5 min more (debootstrap). The test image and the build's layers are removed afterwards.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client_test_util import BIN, CLIENT, free_port, stop  # noqa: E402

import drafthead_client as dc  # noqa: E402

SRC = os.environ.get("DRAFTHEAD_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(BIN, "server", "drafthead-server")
CACHE = os.environ.get("DRAFTHEAD_CONTAINER_CACHE", "/var/cache/drafthead-container")
BASE = "localhost/drafthead-base:bookworm"
# Per run: `podman rmi -f` at the end also removes the containers of an image, so two runs on one
# host (two checkouts testing at once) must not share a tag.
IMAGE = f"localhost/drafthead-test-{os.getpid()}:cpu"
BASE_MAX_AGE_S = 7 * 24 * 3600
SKIP = 77
K, PADDED, SEED = 256, 2048, 7
PODMAN_RUN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
RUN_FLAGS = ["--network=host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]


def log(msg):
    print(f"[container] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def sh(args, timeout, check=True, **kw):
    log("$ " + " ".join(args))
    p = subprocess.run(args, timeout=timeout, text=True, capture_output=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def skip(reason):
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIP)


def ensure_tools():
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None and
               not os.path.exists(f"/usr/sbin/{t}")]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        skip(f"{', '.join(missing)} missing and cannot be installed here (not root or no apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh(["apt-get", "update"], timeout=600, check=False, env=env)
    p = sh(["apt-get", "install", "-y", "--no-install-recommends", "podman", "runc", "debootstrap"],
           timeout=1200, check=False, env=env)
    if p.returncode != 0:
        skip(f"cannot install podman/runc/debootstrap from Debian's packages: {p.stderr[-500:]}")
    os.environ["PATH"] += ":/usr/sbin:/sbin"


def image_age_s(name):
    p = sh(["podman", "image", "inspect", "--format", "{{.Created.Unix}}", name], timeout=60, check=False)
    if p.returncode != 0:
        return None
    try:
        return time.time() - int(p.stdout.strip())
    except ValueError:
        return None


def ensure_base():
    """localhost/drafthead-base:bookworm from debootstrap; the image store or the cached tarball first."""
    age = image_age_s(BASE)
    if age is not None and age < BASE_MAX_AGE_S:
        log(f"base image {BASE} reused ({age / 3600:.1f} h old)")
        return
    tarball = os.path.join(CACHE, "bookworm-minbase.tar")
    if os.path.exists(tarball) and time.time() - os.path.getmtime(tarball) < BASE_MAX_AGE_S:
        sh(["podman", "import", tarball, BASE], timeout=600)
        return
    if os.geteuid() != 0:
        skip("debootstrap needs root to make the base image")
    root = tempfile.mkdtemp(prefix="dh-bookworm-")
    try:
        sh(["debootstrap", "--variant=minbase", "bookworm", root, "http://deb.debian.org/debian"], timeout=1800)
        os.makedirs(CACHE, exist_ok=True)
        with open(tarball + ".tmp", "wb") as f:
            subprocess.run(["tar", "-C", root, "-c", "."], stdout=f, check=True, timeout=600)
        os.replace(tarball + ".tmp", tarball)
        sh(["podman", "import", tarball, BASE], timeout=600)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def can_run_containers():
    p = sh(PODMAN_RUN + ["run", "--rm"] + RUN_FLAGS + [BASE, "true"], timeout=300, check=False)
    if p.returncode != 0:
        skip(f"this machine cannot run a container: {p.stderr.strip()[-800:]}")


def build_image():
    t0 = time.monotonic()
    sh(["podman", "build", "--isolation=chroot", "--network=host", "--format", "docker", "--pull=never",
        "--target", "cpu", "--build-arg", f"CPU_BASE_IMAGE={BASE}", "-f", os.path.join(SRC, "deploy", "Dockerfile"),
        "-t", IMAGE, SRC], timeout=3600)
    log(f"image built in {time.monotonic() - t0:.0f} s")


def wait_serving(target, seconds):
    p = subprocess.run([CLIENT, "info", f"--target={target}", f"--wait={seconds}"], capture_output=True,
                       text=True, timeout=seconds + 30)
    return p.returncode == 0


def answers(head, x):
    """One answer of every mode, as numpy arrays."""
    out = {"full_fp32": head.logits(x, dtype="fp32"), "full_bf16": head.logits(x, dtype="bf16")}
    tk = head.topk(x, 5, probs=True)
    out.update(topk_ids=tk.ids, topk_values=tk.values, topk_probs=tk.probs)
    out["argmax"] = head.argmax(x).ids
    out["sample"] = head.sample(x, temperature=0.8, seed=11).ids
    return {k: np.asarray(v) for k, v in out.items()}


class Load:
    """Callers that send until health says NOT_SERVING (a load balancer moving away), counting."""

    def __init__(self, target, x, callers=4):
        self.ok, self.failed, self.first_error = 0, 0, None
        self.stop = threading.Event()
        self.mu = threading.Lock()
        self.threads = [threading.Thread(target=self.watch, args=(target,))]
        self.threads += [threading.Thread(target=self.call, args=(target, x, i)) for i in range(callers)]
        for t in self.threads:
            t.start()

    def watch(self, target):
        with dc.RemoteDraftHead(target, timeout=10) as h:
            while not self.stop.is_set():
                try:
                    serving = h.serving(timeout=2)
                except Exception:  # noqa: BLE001 (any failure to answer: not serving)
                    serving = False
                if not serving:
                    self.stop.set()
                time.sleep(0.02)

    def call(self, target, x, i):
        with dc.RemoteDraftHead(target, timeout=20, attempts=1) as h:  # no retry: every failure counts
            n = 0
            while not self.stop.is_set():
                try:
                    (h.argmax if n % 2 else h.topk)(x, **({} if n % 2 else {"k": 3}))
                    with self.mu:
                        self.ok += 1
                except Exception as e:  # noqa: BLE001
                    with self.mu:
                        self.failed += 1
                        self.first_error = self.first_error or repr(e)
                n += 1

    def join(self, timeout):
        self.stop.set()
        for t in self.threads:
            t.join(timeout)


def main():
    t_start = time.monotonic()
    ensure_tools()
    ensure_base()
    can_run_containers()
    build_image()

    port, mport, host_port = free_port(), free_port(), free_port()
    target, host_target = f"127.0.0.1:{port}", f"127.0.0.1:{host_port}"
    name = f"drafthead-test-{os.getpid()}"
    env = {"DRAFTHEAD_SYNTHETIC": str(SEED), "DRAFTHEAD_HIDDEN_SIZE": str(K), "DRAFTHEAD_PADDED_VOCAB": str(PADDED),
           "DRAFTHEAD_THREADS": "1", "DRAFTHEAD_LISTEN": target, "DRAFTHEAD_METRICS_LISTEN": f"127.0.0.1:{mport}",
           "DRAFTHEAD_DRAIN_GRACE": "1s", "DRAFTHEAD_DRAIN_TIMEOUT": "10s",
           "DRAFTHEAD_TERMINATION_GRACE_SECONDS": "30"}
    run = PODMAN_RUN + ["run", "-d", "--name", name] + RUN_FLAGS
    for k, v in env.items():
        run += ["-e", f"{k}={v}"]
    # The same server outside the container: this build's program, the image's flags (4 ranks, gloo).
    host_log = open(os.path.join(tempfile.gettempdir(), f"dh-container-host-{os.getpid()}.log"), "w")
    host = subprocess.Popen([SERVER, "--tp=4", "--backend=cpu", "--comm=gloo", f"--synthetic={SEED}",
                             f"--hidden-size={K}", f"--padded-vocab={PADDED}", "--threads=1",
                             f"--listen={host_target}"], stdout=host_log, stderr=subprocess.STDOUT)
    started = False
    try:
        sh(run + [IMAGE], timeout=120)
        started = True
        if not wait_serving(target, 120):
            raise RuntimeError("the container's server did not become SERVING:\n" +
                               sh(["podman", "logs", name], timeout=60, check=False).stderr[-4000:])
        log("container SERVING")
        # Production's user and group: the image's USER, not root; the whole group inside.
        top = sh(["podman", "top", name, "user", "pid", "args"], timeout=60).stdout
        log(top)
        ranks = [l for l in top.splitlines() if "drafthead-server" in l]
        assert len(ranks) == 4, f"want 4 rank processes in the container:\n{top}"
        assert all(l.split()[0] in ("10001", "drafthead") for l in ranks), f"not uid 10001:\n{top}"
        hc = sh(["podman", "healthcheck", "run", name], timeout=120, check=False)
        assert hc.returncode == 0, f"the image's HEALTHCHECK failed: {hc.stdout} {hc.stderr}"
        assert wait_serving(host_target, 120), "the host server did not become SERVING"

        x = np.random.default_rng(5).standard_normal((6, K)).astype(np.float32)
        with dc.RemoteDraftHead(target, timeout=60) as c, dc.RemoteDraftHead(host_target, timeout=60) as h:
            inside, outside = answers(c, x), answers(h, x)
        for k in inside:
            assert inside[k].shape == outside[k].shape and np.array_equal(inside[k], outside[k]), \
                f"{k}: the container answers differently from the same server outside it"
        log(f"every mode identical inside and outside ({', '.join(inside)})")

        load = Load(target, x[:2])
        time.sleep(2)
        t_stop = time.monotonic()
        sh(["podman", "stop", "-t", "30", name], timeout=90)
        load.join(30)
        code = sh(["podman", "inspect", "--format", "{{.State.ExitCode}}", name], timeout=60).stdout.strip()
        logs = sh(["podman", "logs", name], timeout=60, check=False)
        log(f"stopped in {time.monotonic() - t_stop:.1f} s, exit code {code}; {load.ok} requests answered, "
            f"{load.failed} failed")
        assert code == "0", f"exit code {code} after podman stop:\n{logs.stderr[-3000:]}"
        assert "event=draining" in logs.stdout + logs.stderr, (logs.stdout + logs.stderr)[-3000:]
        assert load.ok > 10, f"too few requests answered under load ({load.ok})"
        assert load.failed == 0, f"{load.failed} requests failed during the drain: {load.first_error}"
    finally:
        if started:
            sh(["podman", "rm", "-f", name], timeout=120, check=False)
        stop(host, timeout=30)
        host_log.close()
        # The test image and the build's intermediate layers go (a few GB a run otherwise); the
        # base image stays (reused for a week).
        sh(["podman", "rmi", "-f", IMAGE], timeout=300, check=False)
        sh(["podman", "image", "prune", "-f"], timeout=600, check=False)
    log(f"PASS in {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
