#!/usr/bin/env python3
"""sched_bench: issue 28's scheduler acceptance figures, measured on `bonsai serve`
started with its DEFAULT flags (no --pool-size, no -np, no -b) over MODEL.

  bench/sched_bench.py --bonsai build/apps/bonsai/bonsai [--model F] [--threads T]
                       [--serve-arg=--step-budget-ms=40 ...] [--only concurrency,prefix,arrival]
                       [--out bench/results/x.json]

MODEL defaults to the 1.7B shape made once with
`bonsai synth --preset 1.7b -o /tmp/b17.gguf` (random weights: the text is
meaningless, the timings are real). Prompts are token-id arrays (the
/v1/completions `prompt` as tokens), so their lengths are exact.

Three scenarios, each printing its figures and the criterion it checks:
  concurrency  16 streaming completions at once (max_tokens 48, ignore_eos):
               how many were refused (want 0), the most
               vllm:num_requests_running seen while they ran (want 16, polled
               every 20 ms) and the widest step in bonsai_batch_tokens_per_step
               (want a bucket >= 16), and the aggregate decode rate.
  prefix       one warm-up request with a 1,500-token system prompt, then 8
               concurrent requests with the same system prompt and their own
               32-token questions: each one's usage.prompt_tokens_details.
               cached_tokens (want >= 1,500) and TTFT against the warm-up's
               (want <= 1/4).
  arrival      a stream that decodes (A), then a 4,000-token prompt (B), then
               a 32-token request (C) 1 s later: C's TTFT against its own
               prompt time alone + 3 steps (want within), and A's
               inter-token gaps while B's prompt runs against its decode step
               before B came (p50 and max; the default budget aims at 2x).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from serve_bench import cpu_model, free_port  # (this folder: Python puts it on sys.path)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    keep = ("avx2", "avx512f", "avx512_vnni", "avx512vnni", "avx_vnni", "avx512_vbmi", "amx_int8")
                    return " ".join(x for x in line.split(":", 1)[1].split() if x in keep)
    except OSError:
        pass
    return ""


def stream(url, prompt, max_tokens, out, extra=None):
    """One streaming /v1/completions; records the arrival time of every token
    event, the HTTP status and the final usage into `out` (a dict)."""
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    if extra:
        body.update(extra)
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out["t_send"] = time.monotonic()
    out["times"] = []
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            out["status"] = r.status
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("usage"):
                    out["usage"] = ev["usage"]
                if ev.get("choices") and ev["choices"][0].get("text"):
                    out["times"].append(time.monotonic())
    except urllib.error.HTTPError as e:
        out["status"] = e.code
    except Exception as e:  # noqa: BLE001 (a bench: report, do not die)
        out["status"] = "error: %s" % e


def metrics(url):
    return urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()


def gauge(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def step_hist(text):
    """bonsai_batch_tokens_per_step cumulative buckets: {le: count}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'bonsai_batch_tokens_per_step_bucket\{.*le="([^"]+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def widest_step(before, after):
    """The smallest bucket bound b such that no step since `before` had more than b tokens."""
    bounds = sorted((float(k) if k != "+Inf" else float("inf"), k) for k in after)
    total = after.get("+Inf", 0) - before.get("+Inf", 0)
    for b, k in bounds:
        if after[k] - before.get(k, 0) >= total:
            return b
    return None


def tokens(seed, n, vocab=151000):
    # Ids of ordinary vocabulary entries (away from the special tokens at the end).
    return [(seed * 7919 + i * 104729) % vocab + 10 for i in range(n)]


def ttft(o):
    return o["times"][0] - o["t_send"] if o.get("times") else None


def scenario_concurrency(url, res):
    n = 16
    outs = [dict() for _ in range(n)]
    before = step_hist(metrics(url))
    most = [0.0]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            v = gauge(metrics(url), "vllm:num_requests_running")
            if v is not None:
                most[0] = max(most[0], v)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    ths = [threading.Thread(target=stream, args=(url, tokens(100 + i, 32), 48, outs[i])) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    stop.set()
    poller.join()
    after = step_hist(metrics(url))
    refused = sum(1 for o in outs if o.get("status") != 200)
    firsts = [o["times"][0] for o in outs if o.get("times")]
    lasts = [o["times"][-1] for o in outs if o.get("times")]
    toks = sum(len(o["times"]) for o in outs)
    agg = toks / (max(lasts) - min(firsts)) if firsts and max(lasts) > min(firsts) else 0
    res["concurrency"] = {"clients": n, "refused": refused, "max_running": most[0],
                          "widest_step_bucket": widest_step(before, after), "aggregate_tok_s": agg}
    print("concurrency: %d clients, %d refused (want 0), vllm:num_requests_running max %.0f (want 16), "
          "widest step <= %s tokens (want a bucket >= 16), aggregate %.1f tok/s"
          % (n, refused, most[0], widest_step(before, after), agg))


def scenario_prefix(url, res):
    system = tokens(7, 1500)
    warm = {}
    stream(url, system + tokens(1000, 32), 4, warm)
    outs = [dict() for _ in range(8)]
    ths = [threading.Thread(target=stream, args=(url, system + tokens(2000 + i, 32), 4, outs[i])) for i in range(8)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    cached = [o.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens") for o in outs]
    ttfts = [ttft(o) for o in outs]
    w = ttft(warm)
    res["prefix"] = {"warm_ttft_s": w, "ttft_s": ttfts, "cached_tokens": cached}
    ok_cached = all(c is not None and c >= 1500 for c in cached)
    worst = max(t for t in ttfts if t is not None) if any(ttfts) else None
    print("prefix: warm-up TTFT %.3f s; 8 concurrent: cached_tokens %s (want all >= 1500: %s); TTFT max %.3f s = "
          "%.2fx the warm-up's (want <= 0.25)" % (w, cached, "yes" if ok_cached else "NO", worst, worst / w))


def scenario_arrival(url, res, long_tokens=4000):
    # C alone first: its own prompt time (TTFT of a lone 32-token request).
    solo = {}
    stream(url, tokens(3000, 32), 2, solo)
    a = {}
    ta = threading.Thread(target=stream, args=(url, tokens(4000, 16), 400, a))
    ta.start()
    time.sleep(3.0)  # A decodes alone: its decode step
    m = metrics(url)
    decode_step = gauge(m, "bonsai_decode_step_seconds")
    n_before = len(a.get("times", []))
    gaps_before = [y - x for x, y in zip(a["times"][max(0, n_before - 40):n_before - 1],
                                           a["times"][max(1, n_before - 39):n_before])]
    b = {}
    tb = threading.Thread(target=stream, args=(url, tokens(5000, long_tokens), 2, b))
    tb.start()
    time.sleep(1.0)
    c = {}
    stream(url, tokens(6000, 32), 2, c)
    tb.join()
    t_b_first = b["times"][0] if b.get("times") else None
    ta.join()
    during = [y - x for x, y in zip(a["times"], a["times"][1:])
              if b.get("t_send") and t_b_first and b["t_send"] <= x and y <= t_b_first]
    p50_before = statistics.median(gaps_before) if gaps_before else None
    p50_during = statistics.median(during) if during else None
    mx_during = max(during) if during else None
    res["arrival"] = {"solo_ttft_s": ttft(solo), "c_ttft_s": ttft(c), "b_ttft_s": ttft(b), "decode_step_s": decode_step,
                      "a_gap_p50_before_s": p50_before, "a_gap_p50_during_s": p50_during,
                      "a_gap_max_during_s": mx_during, "a_gaps_during": len(during)}
    print("arrival: C (32 tokens, 1 s into B's %d-token prompt) TTFT %.3f s vs alone %.3f s + 3 steps of <= ~%.2f s "
          "(want within); B TTFT %.1f s" % (long_tokens, ttft(c), ttft(solo), max(0.5, 2 * (decode_step or 0)),
                                          ttft(b) or -1))
    if p50_before and p50_during:
        print("arrival: A's inter-token gap p50 %.4f s before B, %.4f s during B's prompt (%.2fx; max %.4f s = %.2fx; "
              "default budget aims at 2x)" % (p50_before, p50_during, p50_during / p50_before, mx_during,
                                              mx_during / p50_before))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bonsai", default="build/apps/bonsai/bonsai")
    ap.add_argument("--model", default="/tmp/b17.gguf")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--only", default="concurrency,prefix,arrival")
    ap.add_argument("--out")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        subprocess.run([a.bonsai, "synth", "--preset", "1.7b", "-o", a.model], check=True)
    port = free_port()
    cmd = [a.bonsai, "serve", "-m", "m=" + a.model, "--port", str(port), "--timeout", "3600"] + a.serve_arg
    if a.threads:
        cmd += ["-t", str(a.threads)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = "http://127.0.0.1:%d" % port
    res = {"cpu": cpu_model(), "flags": cpu_flags(), "cmd": " ".join(cmd), "date": time.strftime("%Y-%m-%d %H:%M")}
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except Exception:  # noqa: BLE001
                time.sleep(0.2)
        print("cpu: %s (%s); server: %s" % (res["cpu"], res["flags"], res["cmd"]))
        for s in a.only.split(","):
            {"concurrency": scenario_concurrency, "prefix": scenario_prefix, "arrival": scenario_arrival}[s](url, res)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
