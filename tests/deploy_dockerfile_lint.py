#!/usr/bin/env python3
"""tests/deploy_dockerfile_lint.py: a small lint of deploy/Dockerfile (hadolint is not packaged
for Debian 12), for the rules this project's images depend on:
  - every stage is named (FROM ... AS name); the four expected stages exist; the default (last)
    stage is the CUDA runtime image; builder = CUDA *devel*, runtime = CUDA *runtime*, same version;
  - the builders only call deploy/build.sh / deploy/build-cpu.sh (the steps CI runs outside
    Docker), with -DDRAFTHEAD_CUDA=ON via --cuda=ON and ${CUDA_ARCHS} (ARG, default 90a);
  - each runtime stage: USER non-root (numeric, not 0) last, STOPSIGNAL SIGTERM, a HEALTHCHECK
    through drafthead-healthcheck with a start period, an exec-form ENTRYPOINT to the entrypoint;
  - no ADD (no URLs, no implicit tar extraction), no :latest, no apt-get without
    --no-install-recommends, no -dev package in a runtime stage, no sudo;
  - every COPY source exists in the repository; the .dockerignore keeps build trees and .git out."""
import json
import os
import re
import sys

SRC = os.environ.get("DRAFTHEAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "deploy", "Dockerfile")
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


# Instructions: join continuation lines, drop comments and the parser directive.
instrs = []
buf = ""
for line in open(path):
    s = line.rstrip("\n")
    if not buf and (s.strip().startswith("#") or not s.strip()):
        continue
    if buf and s.strip().startswith("#"):
        continue  # a comment inside a continued instruction
    if s.endswith("\\"):
        buf += s[:-1] + " "
        continue
    buf += s
    word, _, rest = buf.strip().partition(" ")
    instrs.append((word.upper(), rest.strip()))
    buf = ""
check(not buf, "no dangling line continuation")

global_args = {}
stages = []  # dicts: name, base, instrs
for word, rest in instrs:
    if word == "FROM":
        m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
        check(m and m.group(2), f"stage named: FROM {rest}")
        stages.append({"name": m.group(2) if m else None, "base": m.group(1) if m else rest, "instrs": []})
    elif not stages:
        check(word == "ARG", f"only ARG before the first FROM ({word})")
        k, _, v = rest.partition("=")
        global_args[k] = v
    else:
        stages[-1]["instrs"].append((word, rest))


def expand(s, args):
    for _ in range(5):
        s = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), s)
    return s


for st in stages:
    st["base"] = expand(st["base"], global_args)

by = {s["name"]: s for s in stages}
check(set(by) >= {"cpu-builder", "cpu", "cuda-builder", "cuda"}, f"stages cpu-builder, cpu, cuda-builder, cuda ({sorted(by)})")
check(stages[-1]["name"] == "cuda", "the default (last) target is the CUDA runtime image")
cb, cr = by["cuda-builder"]["base"], by["cuda"]["base"]
check(re.fullmatch(r"nvidia/cuda:13\.0\.\d+-devel-\S+", cb) is not None, f"CUDA builder on a CUDA 13.0 devel image ({cb})")
check(re.fullmatch(r"nvidia/cuda:13\.0\.\d+-runtime-\S+", cr) is not None, f"CUDA runtime on a CUDA 13.0 runtime image ({cr})")
check(cb.replace("-devel-", "-runtime-") == cr, "builder and runtime images: same CUDA version and distribution")
check(by["cpu-builder"]["base"] == "debian:12" and by["cpu"]["base"] == "debian:12", "CPU stages on plain debian:12")

all_text = " ".join(r for _, r in instrs)
check(not re.search(r"\bADD\b", " ".join(w for w, _ in instrs)), "no ADD instruction (COPY only; no URLs)")
check(not re.search(r"https?://", " ".join(r for w, r in instrs if w in ("COPY", "ADD"))), "no URL sources")
check(not re.search(r":latest\b", all_text) and all(":" in s["base"] or s["base"] in by for s in stages),
      "every base image pinned to a tag (no :latest)")
check("sudo " not in all_text, "no sudo")

# Builders: the scripted steps.
cbi = by["cuda-builder"]["instrs"]
args = {r.partition("=")[0]: r.partition("=")[2] for w, r in cbi if w == "ARG"}
check(args.get("CUDA_ARCHS") == "90a", "cuda-builder: ARG CUDA_ARCHS defaults to 90a")
runs = [r for w, r in cbi if w == "RUN"]
check(any("deploy/build.sh build" in r and "--cuda=ON" in r and '--cuda-archs="${CUDA_ARCHS}"' in r for r in runs),
      "cuda-builder: deploy/build.sh build --cuda=ON --cuda-archs=${CUDA_ARCHS}")
build_sh = open(os.path.join(SRC, "deploy", "build.sh")).read()
check('-DDRAFTHEAD_CUDA="$cuda"' in build_sh and '-DDRAFTHEAD_CUDA_ARCHITECTURES="$archs"' in build_sh,
      "build.sh passes -DDRAFTHEAD_CUDA and -DDRAFTHEAD_CUDA_ARCHITECTURES to CMake")
cpr = [r for w, r in by["cpu-builder"]["instrs"] if w == "RUN"]
check(any("deploy/build-cpu.sh deps" in r for r in cpr) and any("deploy/build-cpu.sh build" in r for r in cpr),
      "cpu-builder: runs deploy/build-cpu.sh deps and build (the steps tests/deploy_build_test.sh runs)")
for st in stages:
    for w, r in st["instrs"]:
        if w == "RUN" and "apt-get install" in r:
            check("--no-install-recommends" in r, f"{st['name']}: apt-get install --no-install-recommends")

# Runtime stages.
for name in ("cpu", "cuda"):
    ins = by[name]["instrs"]
    words = [w for w, _ in ins]
    users = [r for w, r in ins if w == "USER"]
    check(users and re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", users[-1]) is not None,
          f"{name}: USER non-root, numeric ({users[-1] if users else None})")
    check(("STOPSIGNAL", "SIGTERM") in ins, f"{name}: STOPSIGNAL SIGTERM")
    hcs = [r for w, r in ins if w == "HEALTHCHECK"]
    check(len(hcs) == 1 and "drafthead-healthcheck" in hcs[0] and "--start-period=" in hcs[0] and "--timeout=" in hcs[0],
          f"{name}: HEALTHCHECK through drafthead-healthcheck with start period and timeout")
    eps = [r for w, r in ins if w == "ENTRYPOINT"]
    ok = False
    if eps:
        try:
            ok = json.loads(eps[-1]) == ["/usr/local/bin/drafthead-entrypoint"]
        except ValueError:
            ok = False
    check(ok, f"{name}: exec-form ENTRYPOINT [\"/usr/local/bin/drafthead-entrypoint\"] (the server gets signals directly)")
    check(any(w == "COPY" and r.startswith(f"--from={name}-builder /stage/bin/") for w, r in ins),
          f"{name}: programs copied from its builder's stage")
    run = " ".join(r for w, r in ins if w == "RUN")
    check(not re.search(r"\b\S+-dev\b", run), f"{name}: installs no -dev package")
    check("install-runtime.sh" in run, f"{name}: runtime packages installed by deploy/install-runtime.sh")
    env = " ".join(r for w, r in ins if w == "ENV")
    check("DRAFTHEAD_LISTEN=0.0.0.0:50051" in env, f"{name}: listens on all interfaces in the container")
    check("EXPOSE" in words, f"{name}: EXPOSE")

# COPY sources exist (relative to the build context, the repository root).
for st in stages:
    for w, r in st["instrs"]:
        if w == "COPY" and not r.startswith("--from="):
            parts = [p for p in r.split() if not p.startswith("--")]
            for p in parts[:-1]:
                check(p == "." or os.path.exists(os.path.join(SRC, p)), f"{st['name']}: COPY source {p} exists")

ign = os.path.join(SRC, ".dockerignore")
buildkit_ign = os.path.join(SRC, "deploy", "Dockerfile.dockerignore")
check(os.path.exists(buildkit_ign) and os.path.realpath(buildkit_ign) == os.path.realpath(ign),
      "deploy/Dockerfile.dockerignore (BuildKit reads it for deploy/Dockerfile) is the root .dockerignore")
if check(os.path.exists(ign), ".dockerignore exists at the context root (every builder reads it)"):
    rules = [l.strip() for l in open(ign) if l.strip() and not l.startswith("#")]
    check(all(r in rules for r in (".git", "build", "build-*", "bundle*", ".ccache")),
          ".dockerignore excludes .git, build trees, bundles and caches")
    check(not any(r in ("deploy", "server", "client", "common", "tools", "kernels", "proto", "CMakeLists.txt", "*") for r in rules),
          ".dockerignore keeps the sources")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
