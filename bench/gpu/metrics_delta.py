#!/usr/bin/env python3
"""What the server did over a window, from two scrapes of its Prometheus /metrics (issue 22's c=64
question: are the GPU's batches back to back, and how full are they).

    metrics_delta.py snap HOST:PORT FILE           # a scrape, with its time, into FILE (JSON)
    metrics_delta.py delta BEFORE AFTER LABEL      # one Markdown row of the window between them

The row: batches, rows a batch, rows/s, the share of the window's wall time the server spent in
compute and in each GPU stage (gemv, epilogue, h2d, d2h: the timed batches' mean event time times
the window's batches, as the server times one batch in --cuda-stage-events-every), per batch in
us, and the share of batches launched ahead of the one running (BatchLoop's launch-ahead; the rest
waited for the host). gemv + epilogue + d2h is the step stream's busy share (near 1.0: it never
waits); a step launched ahead uploads on the copy stream beside the GEMV, so h2d overlaps them."""
import json
import sys
import time
import urllib.request


def snap(addr: str, path: str) -> None:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    values = {"_t": time.time()}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, v = line.rpartition(" ")
        try:
            values[key] = float(v)
        except ValueError:
            pass
    with open(path, "w") as f:
        json.dump(values, f)


def header() -> None:
    print("| window | s | batches | rows a batch | rows/s | compute share | gemv / epilogue / h2d / d2h share | "
          "compute / gemv / epilogue us a batch | launched ahead |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def delta(before: str, after: str, label: str) -> None:
    a, b = json.load(open(before)), json.load(open(after))
    dt = b["_t"] - a["_t"]
    d = {k: b[k] - a.get(k, 0.0) for k in b}
    total = lambda prefix: sum(v for k, v in d.items() if k.startswith(prefix))  # noqa: E731
    batches, rows = total("drafthead_batches_total"), total("drafthead_rows_total")
    def stage(s: str) -> float:  # the window's seconds in stage s, from its timed batches' mean
        n = d.get(f'drafthead_stage_seconds_count{{stage="{s}"}}', 0.0)
        return d.get(f'drafthead_stage_seconds_sum{{stage="{s}"}}', 0.0) / n * batches if n > 0 else 0.0
    compute = d.get("drafthead_compute_seconds_sum", 0.0)
    ahead = total("drafthead_launched_ahead_batches_total")
    per = lambda s: 1e6 * s / max(batches, 1)  # noqa: E731
    print(f"| {label} | {dt:.1f} | {batches:.0f} | {rows / max(batches, 1):.1f} | {rows / dt:.0f} | {compute / dt:.3f} | "
          f"{stage('gemv') / dt:.3f} / {stage('epilogue') / dt:.3f} / {stage('h2d') / dt:.3f} / {stage('d2h') / dt:.3f} | "
          f"{per(compute):.0f} / {per(stage('gemv')):.0f} / {per(stage('epilogue')):.0f} | "
          f"{ahead / max(batches, 1):.2f} |")


if __name__ == "__main__":
    if sys.argv[1] == "snap":
        snap(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "header":
        header()
    else:
        delta(sys.argv[2], sys.argv[3], sys.argv[4])
