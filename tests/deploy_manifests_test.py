#!/usr/bin/env python3
"""tests/deploy_manifests_test.py: parses deploy/docker-compose.yml, deploy/prometheus*.yml and
deploy/k8s/*.yaml (PyYAML: Debian's python3-yaml) and checks the fields an operator relies on:
4 GPUs reserved, shared memory and memlock for NCCL, read-only weights, probes, grace periods
longer than the drain, restart policies, and that the environment they set is accepted by the
entrypoint (run in dry-run mode). No container engine or cluster is needed."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pyenv's python3 may lack it where Debian's has python3-yaml
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("FAIL: PyYAML is missing: apt-get install python3-yaml")

SRC = os.environ.get("DRAFTHEAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(SRC, "deploy")
passed, failed = 0, 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
        print("PASS:", what)
    else:
        failed += 1
        print("FAIL:", what)
    return cond


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def duration_s(v):
    """Seconds in a Go/absl-style duration: 5s, 1m30s, 500ms, 60s; compose also accepts these."""
    v = str(v)
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(ms|us|ns|h|m|s)", v):
        total += float(num) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
    return total


def mem_bytes(v):
    m = re.fullmatch(r"([0-9.]+)\s*([kKmMgGtT]?)(i?)[bB]?", str(v))
    assert m, v
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return float(m.group(1)) * mult


def drain_s(env):
    return duration_s(env.get("DRAFTHEAD_DRAIN_GRACE", "0s")) + duration_s(env.get("DRAFTHEAD_DRAIN_TIMEOUT", "30s"))


def entrypoint_accepts(env, what):
    """The entrypoint, in dry-run mode, accepts this environment (paths made to exist)."""
    tmp = tempfile.mkdtemp()
    try:
        e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DRAFTHEAD_DRY_RUN": "1",
             "DRAFTHEAD_BIN": shutil.which("true") or "/bin/true"}
        for k, v in env.items():
            v = str(v)
            if k in ("DRAFTHEAD_WEIGHTS",):
                open(os.path.join(tmp, "model.safetensors"), "w").close()
                v = tmp
            e[k] = v
        r = subprocess.run(["bash", os.path.join(DEPLOY, "entrypoint.sh")], env=e, capture_output=True,
                           text=True, timeout=30)
        ok = check(r.returncode == 0, f"{what}: the entrypoint accepts its environment")
        if not ok:
            print(r.stderr)
        return r.stdout.split("\n")
    finally:
        shutil.rmtree(tmp)


# ---- docker compose --------------------------------------------------------------------------------
compose = load(os.path.join(DEPLOY, "docker-compose.yml"))[0]
svc = compose["services"]["drafthead"]
env = {k: str(v) for k, v in svc["environment"].items()}
devs = svc["deploy"]["resources"]["reservations"]["devices"]
check(len(devs) == 1 and devs[0]["driver"] == "nvidia" and devs[0]["count"] == 4 and devs[0]["capabilities"] == ["gpu"],
      "compose: 4 NVIDIA GPUs reserved (driver nvidia, count 4, capabilities [gpu])")
check(mem_bytes(svc["shm_size"]) >= 1 << 30, f"compose: shm_size {svc['shm_size']} >= 1 GiB for NCCL")
ml = svc["ulimits"]["memlock"]
check(ml == -1 or (ml.get("soft") == -1 and ml.get("hard") == -1), "compose: memlock unlimited")
w = [v for v in svc["volumes"] if isinstance(v, dict) and v.get("target") == "/weights"]
check(len(w) == 1 and w[0].get("read_only") is True, "compose: weights mounted read-only at /weights")
check(env.get("DRAFTHEAD_WEIGHTS") == "/weights", "compose: DRAFTHEAD_WEIGHTS points at the mount")
ports = [str(p) for p in svc["ports"]]
check(any(p.endswith(":50051") for p in ports) and any(p.endswith(":9464") for p in ports),
      "compose: gRPC (50051) and metrics (9464) ports published")
check(svc.get("restart") in ("on-failure", "unless-stopped", "always"), f"compose: restart policy {svc.get('restart')}")
grace = duration_s(svc["stop_grace_period"])
check(grace > drain_s(env), f"compose: stop_grace_period {grace}s > drain grace + drain timeout {drain_s(env)}s")
check(svc.get("stop_signal", "SIGTERM") == "SIGTERM", "compose: stops with SIGTERM")
hc = svc["healthcheck"]
check("drafthead-healthcheck" in " ".join(hc["test"]) and duration_s(hc["start_period"]) >= 1800,
      "compose: health check through drafthead-healthcheck, start_period >= 30 min")
check(duration_s(hc["timeout"]) > duration_s(env.get("DRAFTHEAD_HEALTH_WAIT", "5s")), "compose: health timeout > probe wait")
check(env.get("DRAFTHEAD_TP") == "4" and env.get("DRAFTHEAD_BACKEND") == "cuda" and env.get("DRAFTHEAD_COMM") == "nccl",
      "compose: 4 ranks, CUDA, NCCL")
check(svc["build"]["dockerfile"] == "deploy/Dockerfile" and os.path.exists(os.path.join(DEPLOY, svc["build"]["context"], "CMakeLists.txt")),
      "compose: builds deploy/Dockerfile from the repository root")
check(int(env.get("DRAFTHEAD_TERMINATION_GRACE_SECONDS", "0")) == int(grace),
      "compose: DRAFTHEAD_TERMINATION_GRACE_SECONDS equals stop_grace_period")
entrypoint_accepts(env, "compose")
prom = compose["services"]["prometheus"]
mounts = {v["target"]: v for v in prom["volumes"] if isinstance(v, dict)}
check("/etc/prometheus/prometheus.yml" in mounts and os.path.exists(os.path.join(DEPLOY, mounts["/etc/prometheus/prometheus.yml"]["source"])),
      "compose: Prometheus gets deploy/prometheus.yml")

pcfg = load(os.path.join(DEPLOY, "prometheus.yml"))[0]
targets = [t for sc in pcfg["scrape_configs"] for s in sc.get("static_configs", []) for t in s["targets"]]
check("drafthead:9464" in targets, "prometheus.yml scrapes drafthead:9464")
check(all(r in [m["target"] for m in mounts.values()] for r in pcfg.get("rule_files", [])),
      "prometheus.yml's rule files are mounted by compose")
rules = load(os.path.join(DEPLOY, "prometheus-rules.yml"))[0]
metric_names = set(re.findall(r'"(drafthead_[a-z_]+)"', open(os.path.join(SRC, "server", "sched", "metrics.cc")).read()))
used = set()
for g in rules["groups"]:
    for r in g["rules"]:
        used |= set(re.findall(r"drafthead_[a-z_]+", r["expr"]))
unknown = {u for u in used if u not in metric_names and re.sub(r"_(bucket|sum|count)$", "", u) not in metric_names}
check(not unknown, f"alert rules use only metrics server/metrics.cc exports (unknown: {sorted(unknown)})")
promtool = shutil.which("promtool")
if promtool:
    with tempfile.TemporaryDirectory() as t:
        cfg = os.path.join(t, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write(open(os.path.join(DEPLOY, "prometheus.yml")).read().replace(
                "/etc/prometheus/drafthead-rules.yml", os.path.join(DEPLOY, "prometheus-rules.yml")))
        r = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "promtool check config (with the rules)") or print(r.stdout, r.stderr)
else:
    print("SKIP: promtool not installed (Debian package prometheus)")

# ---- systemd (bare metal) ----------------------------------------------------------------------------
unit = {}
for line in open(os.path.join(DEPLOY, "systemd", "drafthead.service")):
    line = line.strip()
    if line and not line.startswith(("#", "[")) and "=" in line:
        k, _, v = line.partition("=")
        unit[k] = v
senv = {}
for line in open(os.path.join(DEPLOY, "systemd", "drafthead.env")):
    line = line.strip()
    if line and not line.startswith("#"):
        k, _, v = line.partition("=")
        senv[k] = v
check(unit.get("KillSignal") == "SIGTERM" and unit.get("KillMode") == "mixed", "systemd: SIGTERM to the server, SIGKILL to all at the deadline")
check(duration_s(unit["TimeoutStopSec"]) > drain_s(senv), f"systemd: TimeoutStopSec {unit['TimeoutStopSec']} > drain {drain_s(senv)}s")
check(int(senv["DRAFTHEAD_TERMINATION_GRACE_SECONDS"]) == duration_s(unit["TimeoutStopSec"]), "systemd: DRAFTHEAD_TERMINATION_GRACE_SECONDS = TimeoutStopSec")
check(unit.get("Restart") == "on-failure" and unit.get("RestartPreventExitStatus") == "64", "systemd: restart on failure, not on a configuration error (64)")
check(unit.get("LimitMEMLOCK") == "infinity", "systemd: memlock unlimited for NCCL")
check(duration_s(unit["TimeoutStartSec"].replace("min", "m")) >= 1800, "systemd: TimeoutStartSec covers weight loading")
entrypoint_accepts({k: v for k, v in senv.items() if k != "DRAFTHEAD_BIN"}, "systemd drafthead.env")
sa = shutil.which("systemd-analyze")
if sa:
    r = subprocess.run([sa, "verify", os.path.join(DEPLOY, "systemd", "drafthead.service")], capture_output=True, text=True, timeout=60)
    bad = [l for l in (r.stdout + r.stderr).splitlines() if "Unknown" in l or "Invalid" in l or "Failed to parse" in l]
    check(not bad, f"systemd-analyze verify: no unknown or invalid settings {bad}")
else:
    print("SKIP: systemd-analyze not installed")

# ---- Kubernetes --------------------------------------------------------------------------------------
K8S = os.path.join(DEPLOY, "k8s")
objs = {}
for fn in sorted(os.listdir(K8S)):
    if fn.endswith(".yaml"):
        for d in load(os.path.join(K8S, fn)):
            check("kind" in d and "apiVersion" in d, f"k8s/{fn}: {d.get('kind')} has kind and apiVersion")
            objs[(d["kind"], d["metadata"]["name"] if "metadata" in d else fn)] = d
kust = objs[("Kustomization", "kustomization.yaml")]
check(all(os.path.exists(os.path.join(K8S, r)) for r in kust["resources"]), "kustomization lists existing files")
cm = objs[("ConfigMap", "drafthead-config")]["data"]


def pod_checks(name, dep, group_form):
    spec = dep["spec"]["template"]["spec"]
    cs = spec["containers"]
    cenv = dict(cm)
    tgps = spec["terminationGracePeriodSeconds"]
    check(tgps > drain_s(cm), f"{name}: terminationGracePeriodSeconds {tgps} > drain {drain_s(cm)}s")
    check(int(cm.get("DRAFTHEAD_TERMINATION_GRACE_SECONDS", 0)) == tgps, f"{name}: ConfigMap's DRAFTHEAD_TERMINATION_GRACE_SECONDS = {tgps}")
    check(spec.get("enableServiceLinks") is False, f"{name}: enableServiceLinks false (no DRAFTHEAD_* service-link variables)")
    vols = {v["name"]: v for v in spec["volumes"]}
    shm = [v for v in vols.values() if v.get("emptyDir", {}).get("medium") == "Memory"]
    check(len(shm) == 1 and mem_bytes(shm[0]["emptyDir"]["sizeLimit"]) >= 1 << 30, f"{name}: a Memory emptyDir for /dev/shm")
    wv = [v for v in vols.values() if "persistentVolumeClaim" in v or "hostPath" in v]
    check(len(wv) == 1 and (wv[0].get("persistentVolumeClaim", {}).get("readOnly") is True or "hostPath" in wv[0]),
          f"{name}: the weights volume is read-only")
    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, f"{name}: runs as non-root")
    aff = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    check(aff[0]["topologyKey"] == "kubernetes.io/hostname" and spec.get("nodeSelector"), f"{name}: one pod per GPU node")
    gpus = 0
    serving = []
    for c in cs:
        lim = c["resources"]["limits"]
        gpus += int(lim.get("nvidia.com/gpu", 0))
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        check(mounts.get("/weights", {}).get("readOnly") is True and mounts.get("/dev/shm", {}).get("name") == shm[0]["name"],
              f"{name}/{c['name']}: weights read-only, /dev/shm from the Memory emptyDir")
        check(c["envFrom"][0]["configMapRef"]["name"] == "drafthead-config", f"{name}/{c['name']}: flags from the ConfigMap")
        if "readinessProbe" in c:
            serving.append(c)
        e = dict(cenv)
        for x in c.get("env", []):
            e[x["name"]] = x["value"]
        entrypoint_accepts({k: v for k, v in e.items() if v != ""}, f"{name}/{c['name']}")
    check(gpus == 4, f"{name}: 4 GPUs in limits in all (nvidia.com/gpu)")
    check(len(serving) == 1, f"{name}: one container (rank 0) serves and is probed")
    c = serving[0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports.get("grpc") == 50051 and ports.get("metrics") == 9464, f"{name}: grpc and metrics ports")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = c[probe]
        check(p.get("grpc", {}).get("port") == 50051, f"{name}: {probe} is a native gRPC probe on 50051")
    sp = c["startupProbe"]
    window = sp["failureThreshold"] * sp["periodSeconds"]
    check(window >= 1800 and window >= duration_s(cm.get("DRAFTHEAD_LOAD_TIMEOUT", "30m")),
          f"{name}: startupProbe window {window}s >= 30 min and >= --load-timeout")
    return c


dep = objs[("Deployment", "drafthead")]
c = pod_checks("deployment", dep, True)
check(len(dep["spec"]["template"]["spec"]["containers"]) == 1 and cm["DRAFTHEAD_TP"] == "4", "deployment: the whole group (TP=4) in one container")
check(c["resources"]["limits"]["nvidia.com/gpu"] == 4, "deployment: nvidia.com/gpu: 4 in limits")
ru = dep["spec"]["strategy"]["rollingUpdate"]
check(dep["spec"]["strategy"]["type"] == "RollingUpdate" and ru["maxUnavailable"] == 1, "deployment: rolling update, one pod at a time")
rp = objs[("Deployment", "drafthead-ranks")]
pod_checks("rank-per-container", rp, False)
rcs = rp["spec"]["template"]["spec"]["containers"]
renv = [{x["name"]: x["value"] for x in c["env"]} for c in rcs]
check([e["DRAFTHEAD_RANK"] for e in renv] == ["0", "1", "2", "3"] and all(e["DRAFTHEAD_WORLD"] == "4" for e in renv),
      "rank-per-container: ranks 0-3 of world 4")
check(len({e["DRAFTHEAD_LEADER"] for e in renv}) == 1 and renv[0]["DRAFTHEAD_LEADER"].startswith("127.0.0.1:"),
      "rank-per-container: one leader, rank 0's rendezvous on the pod's loopback")
check(all(c["resources"]["limits"]["nvidia.com/gpu"] == 1 for c in rcs), "rank-per-container: 1 GPU per container")
check(all(e.get("DRAFTHEAD_TP") == "" for e in renv), "rank-per-container: DRAFTHEAD_TP cleared")
for (kind, name), o in objs.items():
    if kind == "Service":
        sel = o["spec"]["selector"]
        targets = [d for (k, n), d in objs.items() if k == "Deployment" and
                   all(d["spec"]["template"]["metadata"]["labels"].get(a) == b for a, b in sel.items())]
        check(len(targets) == 1, f"service {name} selects exactly one Deployment's pods")
        check(any(p["port"] == 50051 and p.get("appProtocol") == "grpc" for p in o["spec"]["ports"]), f"service {name}: gRPC port")
svc = objs[("Service", "drafthead")]
check({p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}, "service drafthead: grpc and metrics ports")
pdb = objs[("PodDisruptionBudget", "drafthead")]
check(pdb["spec"]["maxUnavailable"] == 1, "PodDisruptionBudget: at most one pod down")

kubectl = shutil.which("kubectl")
if kubectl:
    r = subprocess.run([kubectl, "kustomize", K8S], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, "kubectl kustomize renders deploy/k8s") or print(r.stderr)
else:
    print("SKIP: kubectl not installed (no schema validation against a cluster here)")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
