#!/usr/bin/env python3
"""spec_serve_bench: aggregate tokens/s of N concurrent streams through
`bonsai serve` with speculative decoding on (--spec-type ngram) against off
(--spec-type none), issue 29's "never slower" check under batching.

Two servers over the same model (one per setting) run side by side; each
round sends N concurrent /v1/completions (temperature 0, ignore_eos,
max_tokens M, N different prompts) four times, to one, the other, the other,
the first (ABBA; the first side alternates between rounds), and prints each
side's mean aggregate completion tokens / wall seconds and their ratio. The answers of the two must be identical (temperature 0).
The shared VMs drift, so only the paired ratios mean something.

Usage:
  bench/spec_serve_bench.py [--bonsai build/apps/bonsai/bonsai] [--model F] [--clients 8]
                            [--max-tokens 128] [--rounds 5] [--threads 0] [--on-spec ngram]
--on-spec none runs the same comparison between two servers without
speculation: an A/A control whose spread of ratios is this machine's noise
floor for the "on / off" figure.
The default model is ../shared/models/stories260K/stories260K.gguf.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time
import urllib.request

PROMPTS = [
    "Once upon a time, there was a little girl named Lily.",
    "The little dog ran to the park. The little dog",
    "Tom had a red ball. He liked to play with his red ball. Tom",
    "One day, a bird flew over the big tree.",
    "The sun was hot and the children wanted to swim.",
    "Lily and Ben went to the park. Lily and Ben",
    "There was a big cat who liked to sleep.",
    "Mom said, \"Let's go to the store.\" Mom said,",
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start(a, spec):
    port = free_port()
    cmd = [a.bonsai, "serve", "-m", "m=" + a.model, "--port", str(port), "-np", str(a.clients), "--pool-size", "1",
           "-c", "1024", "--timeout", "3600", "--spec-type", spec]
    if a.threads > 0:
        cmd += ["-t", str(a.threads)]
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return srv, url
        except Exception:
            time.sleep(0.1)
    srv.kill()
    raise SystemExit("spec_serve_bench: the server did not start: " + " ".join(cmd))


def one(url, prompt, max_tokens, out, i):
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=3600))
    out[i] = (r["usage"]["completion_tokens"], r["choices"][0]["text"])


def level(url, a):
    out = [None] * a.clients
    ts = [threading.Thread(target=one, args=(url, PROMPTS[i % len(PROMPTS)], a.max_tokens, out, i))
          for i in range(a.clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    return sum(o[0] for o in out) / dt, [o[1] for o in out]


def metric(url, name):
    body = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bonsai", default="build/apps/bonsai/bonsai")
    ap.add_argument("--model", default=os.path.join(os.environ.get("BONSAI_SHARED", "../shared"),
                                                    "models/stories260K/stories260K.gguf"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--on-spec", default="ngram", help="--spec-type of the 'on' server (none: an A/A control)")
    a = ap.parse_args()
    on, url_on = start(a, a.on_spec)
    off, url_off = start(a, "none")
    try:
        level(url_on, a)  # warm-up (and the step-cost estimates)
        level(url_off, a)
        ratios = []
        print("round  on_tok/s  off_tok/s  ratio  same_text")
        for r in range(a.rounds):
            # ABBA (BAAB in odd rounds): each server runs once right after
            # itself and once right after the other, first and last, so an
            # order effect (caches, idle threads waking) cancels within the
            # round instead of favouring whichever side a median lands on.
            order = ["on", "off", "off", "on"] if r % 2 == 0 else ["off", "on", "on", "off"]
            got = {"on": [], "off": []}
            for side in order:
                got[side].append(level(url_on if side == "on" else url_off, a))
            ton = statistics.mean(t for t, _ in got["on"])
            toff = statistics.mean(t for t, _ in got["off"])
            same = all(x == got["off"][0][1] for _, x in got["on"] + got["off"])
            ratios.append(ton / toff)
            print("%5d  %8.1f  %9.1f  %5.3f  %s" % (r + 1, ton, toff, ton / toff, same))
        print("median ratio (on / off): %.3f" % statistics.median(ratios))
        print("proposed %d, accepted %d (vllm:spec_decode_num_*_tokens_total of the server with speculation)" %
              (metric(url_on, "vllm:spec_decode_num_draft_tokens_total"),
               metric(url_on, "vllm:spec_decode_num_accepted_tokens_total")))
    finally:
        on.kill()
        off.kill()


if __name__ == "__main__":
    main()
