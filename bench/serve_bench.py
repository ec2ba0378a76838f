#!/usr/bin/env python3
"""serve_bench: aggregate decode tok/s, TTFT and inter-token latency (p50/p99)
of `bonsai serve` for 1, 2, 4, 8, 16 concurrent streaming clients.

Starts `bonsai serve` on a free port over MODEL (default: the 1.7B shape made
once with `bonsai synth --preset 1.7b -o /tmp/b17.gguf` and reused), with
--pool-size = the largest client count so every client has a sequence slot,
runs each concurrency level (each client streams one /v1/completions answer
of --max-tokens tokens, ignore_eos, temperature 0, distinct prompts so the
prompt cache does not help), and prints one row per level plus a JSON file.

  bench/serve_bench.py --bonsai build/apps/bonsai/bonsai [--model F] [--clients 1,2,4,8,16]
                       [--max-tokens 64] [--threads T] [--batch-size 512] [--repeat R] [--out bench/results/x.json]

Aggregate decode tok/s, two ways (both printed; the criterion uses the first):
  steady: the tokens that arrive while all N clients are decoding (after the
          last client's first token, up to the first client's last token) /
          that window's length: the rate of N-sequence decode steps, which is
          what the kernels' N-column products bound. A window shorter than 4
          tokens' worth falls back to span.
  span:   all tokens after each client's first one / (last token time -
          earliest first-token time); on a compute-bound CPU this also counts
          the other clients' prompt processing, so it understates decode.
--repeat R runs every level R times and keeps the run with the best steady
rate (the least disturbed on a shared machine; every run is printed).

Issue 9's criterion, checked in the same run: the kernel bench
(bonsai_bench_kernels, --kernels-bench) times the 1.7B forward's products for
N = 1..16 columns (per layer q, o: 2048x2048; k, v: 1024x2048; gate, up:
6144x2048; down: 2048x6144; x 28 layers, plus the 151936x2048 output), once
before and once after the serve levels (the mean is used; both printed), and
for every N measured:
  aggregate(N) >= 0.8 x N x aggregate(1) x T(1) / T(N)
where T(N) is the summed time of the N-column products (T(1) = the GEMVs):
the scheduler must deliver 80% of what batching the products allows.
After the levels it prints the server's resident memory against issue 8's bound (VmRSS <= file size + the
model's KV capacity + 5%; also against the KV bytes in use): `--clients 1,2,4` gives the 4-slot figure.
The load average before and after every level is in the JSON (a shared
machine's other work slows levels unevenly).
"""
import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(xs, p):
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# The 1.7B shape's matrix products per token: (rows, cols, count per forward).
PRODUCTS = [(2048, 2048, 2 * 28), (1024, 2048, 2 * 28), (6144, 2048, 2 * 28), (2048, 6144, 28), (151936, 2048, 1)]


def product_times(kbench, levels, threads, fmt):
    """Summed time (us) of one forward's products for each N, from bonsai_bench_kernels."""
    ns = "|".join(str(n) for n in levels)
    shapes = "|".join("rows:%d/cols:%d" % (r, c) for r, c, _ in PRODUCTS)
    filt = "^%s/gem[vm]/fmt:%d/(%s)/threads:%d/n:(%s)(/manual_time)?$" % (
        "Q1_0" if fmt == 0 else "Q2_0", fmt, shapes, threads, ns)
    out = subprocess.run([kbench, "--benchmark_filter=" + filt, "--benchmark_format=json",
                          "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    # The JSON report sits between the tier line and the bench's own summary table.
    rep, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    t = {}
    for b in rep["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        parts = dict(kv.split(":", 1) for kv in b["run_name"].split("/")[2:] if ":" in kv)
        t[(int(parts["rows"]), int(parts["cols"]), int(parts["n"]))] = b["real_time"]  # us (kernels_bench's unit)
    totals = {}
    for n in levels:
        if all((r, c, n) in t for r, c, _ in PRODUCTS):
            totals[n] = sum(k * t[(r, c, n)] for r, c, k in PRODUCTS)
    return totals


def resident_memory(pid, url, model_path):
    """Resident memory of the server process against issue 8's bound: VmRSS <= file size + the model's KV
    capacity + 5%. Reads /proc/PID/status (VmRSS, RssAnon, RssFile, in kB) and /admin/models
    (kv_capacity_bytes: the KV block pool's budget; kv_used_bytes: the blocks held now, running sequences and
    cached prefixes). Returns a dict of MiB figures and whether the bound (and the tighter one counting only
    the KV bytes in use) holds; None where /proc is unreadable."""
    fields = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    fields[key] = int(rest.split()[0]) * 1024
    except OSError:
        return None
    models = json.loads(urllib.request.urlopen(url + "/admin/models", timeout=10).read())
    rows = models.get("data", models) if isinstance(models, dict) else models
    kv_cap = sum(m.get("kv_capacity_bytes", 0) for m in rows)
    kv_used = sum(m.get("kv_used_bytes", 0) for m in rows)
    file_bytes = os.path.getsize(model_path)
    mib = lambda b: round(b / 2**20, 1)
    bound = 1.05 * (file_bytes + kv_cap)
    tight = 1.05 * (file_bytes + kv_used)
    return {"vm_rss_mib": mib(fields.get("VmRSS", 0)), "vm_hwm_mib": mib(fields.get("VmHWM", 0)),
            "rss_anon_mib": mib(fields.get("RssAnon", 0)), "rss_file_mib": mib(fields.get("RssFile", 0)),
            "file_mib": mib(file_bytes), "kv_capacity_mib": mib(kv_cap), "kv_used_mib": mib(kv_used),
            "bound_mib": mib(bound), "met": fields.get("VmRSS", 0) <= bound,
            "tight_bound_mib": mib(tight), "tight_met": fields.get("VmRSS", 0) <= tight}


def print_resident_memory(r, pool_size):
    if r is None:
        print("resident memory: /proc unreadable")
        return
    print("resident memory of serve (%d slots): VmRSS %.1f MiB (peak %.1f; anon %.1f, file %.1f) <= 1.05 x (file %.1f + "
          "KV capacity %.1f) = %.1f MiB: %s; counting only the KV in use (%.1f MiB): <= %.1f MiB: %s" %
          (pool_size, r["vm_rss_mib"], r["vm_hwm_mib"], r["rss_anon_mib"], r["rss_file_mib"], r["file_mib"],
           r["kv_capacity_mib"], r["bound_mib"], "met" if r["met"] else "NOT met", r["kv_used_mib"],
           r["tight_bound_mib"], "met" if r["tight_met"] else "NOT met"), flush=True)


def steady_rate(out, n):
    """Tokens per second while all `n` clients decode (see the module docstring); None if too short."""
    if len(out) < n or any(len(o["times"]) < 2 for o in out):
        return None
    a = max(o["times"][0] for o in out)   # every client has its first token
    b = min(o["times"][-1] for o in out)  # no client has finished
    toks = sum(1 for o in out for t in o["times"] if a < t <= b)
    if b <= a or toks < 4 * n:
        return None
    return toks / (b - a)


def stream_one(url, prompt, max_tokens, out):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    times = []
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(ev["error"])
            ch = ev.get("choices") or []
            if ch and ch[0].get("text"):
                times.append(time.monotonic())
    out.append({"t0": t0, "times": times})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bonsai", default="build/apps/bonsai/bonsai")
    ap.add_argument("--model", default="/tmp/b17.gguf")
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--out", default="")
    ap.add_argument("--kernels-bench", default="build/bench/bonsai_bench_kernels",
                    help="bonsai_bench_kernels binary for the N-column product times ('' to skip)")
    ap.add_argument("--kv-budget-tokens", type=int, default=0, help="serve --kv-budget-tokens (0: default)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per level; the best steady rate is kept")
    ap.add_argument("--paired", action="store_true",
                    help="criterion per N against an adjacent single-stream run and adjacent GEMV / N-column "
                         "product times (drift-proof on a shared machine); prints only the pairs")
    a = ap.parse_args()
    levels = [int(x) for x in a.clients.split(",")]
    if not os.path.exists(a.model):
        subprocess.run([a.bonsai, "synth", "--preset", "1.7b", "-o", a.model], check=True)
    port = free_port()
    cmd = [a.bonsai, "serve", "-m", "m=" + a.model, "--port", str(port), "--pool-size", str(max(levels)),
           "-c", str(a.ctx_size), "-b", str(a.batch_size), "--timeout", "3600"]
    if a.threads > 0:
        cmd += ["-t", str(a.threads)]
    if a.kv_budget_tokens > 0:
        cmd += ["--kv-budget-tokens", str(a.kv_budget_tokens)]
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = "http://127.0.0.1:%d" % port
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except Exception:
                if srv.poll() is not None:
                    sys.exit("bonsai serve exited: " + srv.stdout.read())
                time.sleep(0.5)
        stream_one(url, "Warm up.", 4, [])
        kthreads = a.threads if a.threads > 0 else min(2, os.cpu_count())
        # Kernel product times before the levels (and again after: the mean is used).
        totals_before = product_times(a.kernels_bench, levels, kthreads, 0) if a.kernels_bench and not a.paired else {}
        rows = []
        words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
                 "kilo", "lima", "mike", "november", "oscar", "papa"]
        def run_level(n, tag):
            """Runs `n` clients --repeat times; returns the row with the best steady rate."""
            best = None
            for rep in range(a.repeat):
                out = []
                load_before = os.getloadavg()
                ths = [threading.Thread(target=stream_one,
                                        args=(url, "Story %s%d.%d about %s: once upon a time" %
                                              (tag, n, rep, words[i % 16]), a.max_tokens, out))
                       for i in range(n)]
                for t in ths:
                    t.start()
                for t in ths:
                    t.join()
                ttft = [(o["times"][0] - o["t0"]) * 1000 for o in out if o["times"]]
                itl = [(b - c) * 1000 for o in out for c, b in zip(o["times"], o["times"][1:])]
                first = min(o["times"][0] for o in out if o["times"])
                last = max(o["times"][-1] for o in out if o["times"])
                decode_tokens = sum(max(0, len(o["times"]) - 1) for o in out)
                span = decode_tokens / (last - first) if last > first else 0.0
                steady = steady_rate(out, n)
                agg = steady if steady is not None else span
                row = {"clients": n, "aggregate_decode_tok_s": round(agg, 2),
                       "steady_tok_s": None if steady is None else round(steady, 2), "span_tok_s": round(span, 2),
                       "ttft_p50_ms": round(pct(ttft, 50), 1), "ttft_p99_ms": round(pct(ttft, 99), 1),
                       "itl_p50_ms": round(pct(itl, 50), 1), "itl_p99_ms": round(pct(itl, 99), 1),
                       "tokens": sum(len(o["times"]) for o in out), "run": rep,
                       "loadavg_before": [round(x, 2) for x in load_before],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
                print("%sclients %2d run %d  aggregate %7.2f tok/s (steady %s, span %.2f)  TTFT p50 %8.1f p99 %8.1f ms"
                      "  ITL p50 %7.1f p99 %7.1f ms  load %.2f -> %.2f" %
                      (tag, n, rep, agg, "-" if steady is None else "%.2f" % steady, span, row["ttft_p50_ms"],
                       row["ttft_p99_ms"], row["itl_p50_ms"], row["itl_p99_ms"], load_before[0],
                       row["loadavg_after"][0]), flush=True)
                if best is None or row["aggregate_decode_tok_s"] > best["aggregate_decode_tok_s"]:
                    best = row
            return best

        if a.paired and a.kernels_bench:
            # Each N > 1 against its own adjacent single stream and its own GEMV / N-column product
            # times (before and after the pair), so load drift during the run cancels out.
            paired = []
            for n in levels:
                if n == 1:
                    continue
                tb = product_times(a.kernels_bench, [1, n], kthreads, 0)
                one = run_level(1, "pair%d/" % n)
                row = run_level(n, "pair%d/" % n)
                ta = product_times(a.kernels_bench, [1, n], kthreads, 0)
                gain = (tb[1] + ta[1]) / (tb[n] + ta[n])
                bound = n * one["aggregate_decode_tok_s"] * gain
                ok = row["aggregate_decode_tok_s"] >= 0.8 * bound
                paired.append({"clients": n, "single_tok_s": one["aggregate_decode_tok_s"],
                               "aggregate_decode_tok_s": row["aggregate_decode_tok_s"],
                               "gemv_us": [round(tb[1], 1), round(ta[1], 1)], "product_us": [round(tb[n], 1), round(ta[n], 1)],
                               "gemv_over_product": round(gain, 4), "required_tok_s": round(0.8 * bound, 2),
                               "fraction_of_kernel_bound": round(row["aggregate_decode_tok_s"] / bound, 3), "met": ok})
                print("paired N=%2d: aggregate %7.2f >= 0.8 x %d x %.2f x %.3f = %7.2f tok/s (%.0f%% of the kernel bound; "
                      "GEMV %.1f / %.1f ms, N-column %.1f / %.1f ms before / after): %s" %
                      (n, row["aggregate_decode_tok_s"], n, one["aggregate_decode_tok_s"], gain, 0.8 * bound,
                       100 * paired[-1]["fraction_of_kernel_bound"], tb[1] / 1000, ta[1] / 1000, tb[n] / 1000,
                       ta[n] / 1000, "met" if ok else "NOT met"), flush=True)
            rss = resident_memory(srv.pid, url, a.model)
            print_resident_memory(rss, max(levels))
            result = {"cpu": cpu_model(), "cores": os.cpu_count(), "model": a.model, "flags": cmd[2:],
                      "command": sys.argv, "max_tokens": a.max_tokens, "paired": paired, "resident_memory": rss}
            if a.out:
                os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
                with open(a.out, "w") as f:
                    json.dump(result, f, indent=1)
            return
        for n in levels:
            rows.append(run_level(n, ""))
        # The criterion against the kernels' batching gain, measured in the same run (server idle).
        crit = []
        totals = {}
        if a.kernels_bench:
            totals_after = product_times(a.kernels_bench, levels, kthreads, 0)
            for n in sorted(set(totals_before) & set(totals_after)):
                totals[n] = (totals_before[n] + totals_after[n]) / 2
            print("kernel products per forward (Q1_0, 1.7B shapes, %d threads), before / after the levels: " % kthreads +
                  ", ".join("N=%d %.1f / %.1f ms" % (n, totals_before[n] / 1000, totals_after[n] / 1000)
                            for n in sorted(totals)))
            single = next((r["aggregate_decode_tok_s"] for r in rows if r["clients"] == 1), 0.0)
            for r in rows:
                n = r["clients"]
                if n not in totals or 1 not in totals or single <= 0:
                    continue
                gain = totals[1] / totals[n]  # GEMV time / N-column product time
                need = 0.8 * n * single * gain
                ok = r["aggregate_decode_tok_s"] >= need
                crit.append({"clients": n, "product_ms": round(totals[n] / 1000, 2),
                             "gemv_over_product": round(gain, 4), "required_tok_s": round(need, 2),
                             "aggregate_decode_tok_s": r["aggregate_decode_tok_s"],
                             "fraction_of_kernel_bound": round(r["aggregate_decode_tok_s"] / (n * single * gain), 3),
                             "met": ok})
                print("criterion N=%2d: aggregate %7.2f >= 0.8 x %d x %.2f x %.3f = %7.2f tok/s (%.0f%% of the "
                      "kernel bound): %s" % (n, r["aggregate_decode_tok_s"], n, single, gain, need,
                                             100 * crit[-1]["fraction_of_kernel_bound"], "met" if ok else "NOT met"),
                      flush=True)
        rss = resident_memory(srv.pid, url, a.model)
        print_resident_memory(rss, max(levels))
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        steps = [l for l in metrics.splitlines() if l.startswith("bonsai_batch_tokens_per_step_")]
        result = {"cpu": cpu_model(), "cores": os.cpu_count(), "model": a.model, "flags": cmd[2:],
                  "command": sys.argv, "max_tokens": a.max_tokens, "rows": rows,
                  "product_us": {str(n): round(v, 1) for n, v in totals.items()}, "criterion": crit,
                  "step_histogram": steps, "resident_memory": rss}
        if a.out:
            os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    main()
