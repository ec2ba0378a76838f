#!/usr/bin/env python3
"""Soak test of one `bonsai serve` (a bench script, not a ctest; issue 10 item 6).

  bench/soak/soak.py [--bonsai build/apps/bonsai/bonsai] [--shared ../shared]
                     [--requests 10000] [--clients 8] [--pool-size 4] [--threads 2]
                     [--seed 1] [--out bench/results/soak-....txt]

Starts `bonsai serve` on stories260K (a free loopback port) and:
  1. builds --requests mixed requests from --seed: /v1/completions or
     /v1/chat/completions; streamed (half) or not; n = 1, 2 or 3; stop strings
     on a quarter; max_tokens 8..64; temperature 0 or 0.9 with a seed; 12% of
     the streams are cancelled by the client (socket closed) after 1..6 events;
     every prompt carries a nonce (its index and a random word), so no two
     requests share a prompt and no answer matches another's by chance;
  2. reference pass: sends each request's non-streamed, uncancelled form alone
     (one at a time) and keeps its choices (text, finish_reason) and usage;
  3. soak pass: sends all requests again from --clients threads at once, in a
     shuffled order, and checks each answer against its reference:
       - every choice's text and finish_reason equal the reference's (a stream
         is assembled from its deltas), usage.completion_tokens too;
       - a cancelled stream's text so far is a prefix of the reference's;
       - any 5xx, 4xx, malformed body, truncated stream or client timeout
         (30 s of silence) is a failure (the load is sized to stay below the
         server's queue limit, so not even 503 is expected);
  4. samples the server's VmRSS, open fds (/proc/PID/fd) and threads once a
     second and reports first / last / peak: flat means the median of the last
     tenth of the samples is within 5% + 4 MiB of the first tenth's (RSS) and
     the idle fd count after the run equals the one before it;
  5. prints a report (also written to --out) and exits 1 on any failure.

Cross-talk detection relies on the documented reproducibility: an answer with
a seed (or at temperature 0) is the same whatever runs beside it. The report
says how many references are distinct, i.e. how sharp the check is.
Python standard library only.
"""
import argparse
import datetime
import http.client
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

STARTS = ["Once upon a time", "The little dog", "Lily went to the park", "One day, a big bird",
          "Tom had a red ball", "The sun was hot and", "Sara liked to read", "A small cat named Tim",
          "There was a big tree", "Mom said", "The boy and the girl", "In the garden"]
WORDS = ["apple", "blue", "candy", "dragon", "elbow", "fox", "glove", "hat", "ink", "jam", "kite",
         "lemon", "moon", "nest", "owl", "pig", "queen", "rain", "sock", "toy", "van", "wind"]
STOPS = [".", "\n", " the", ",", "!", " was"]
SOCKET_TIMEOUT_S = 30.0


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = set(line.split(":", 1)[1].split())
                    return ", ".join(x for x in ("avx2", "fma", "f16c", "avx512f", "avx_vnni", "amx_int8")
                                     if x in fl)
    except OSError:
        pass
    return "?"


def make_requests(count, seed):
    """count request specs: dicts with path, body (non-streamed form), stream, cancel_after."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        nonce = f"{rng.choice(WORDS)} {i}"
        start = rng.choice(STARTS)
        prompt = f"{start} {nonce}" if rng.random() < 0.5 else f"{nonce}. {start}"
        body = {"model": "stories", "max_tokens": rng.choice([8, 16, 24, 32, 48, 64])}
        if rng.random() < 0.5:
            path = "/v1/completions"
            body["prompt"] = prompt
        else:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": prompt}]
        r = rng.random()
        body["n"] = 1 if r < 0.7 else (2 if r < 0.9 else 3)
        if rng.random() < 0.25:
            body["stop"] = rng.sample(STOPS, rng.choice([1, 2]))
        if rng.random() < 0.3:
            body["temperature"] = 0
        else:
            body["temperature"] = 0.9
            body["seed"] = rng.randrange(1 << 31)
        stream = rng.random() < 0.5
        cancel_after = rng.randint(1, 6) if stream and rng.random() < 0.12 else 0
        include_usage = stream and rng.random() < 0.5
        out.append({"i": i, "path": path, "body": body, "stream": stream,
                    "cancel_after": cancel_after, "include_usage": include_usage})
    return out


class Server:
    def __init__(self, binary, model, pool_size, threads, workdir):
        self.out = open(os.path.join(workdir, "serve.out"), "wb+")
        self.err = open(os.path.join(workdir, "serve.err"), "wb+")
        self.proc = subprocess.Popen(
            [binary, "serve", "-m", f"stories={model}", "--port", "0", "--pool-size", str(pool_size),
             "-t", str(threads), "-c", "1024"], stdout=self.out, stderr=self.err)
        self.port = None
        end = time.monotonic() + 30
        while time.monotonic() < end and self.port is None:
            if self.proc.poll() is not None:
                break
            with open(self.out.name, errors="replace") as f:
                m = re.search(r"http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.1)
        if self.port is None:
            with open(self.err.name, errors="replace") as f:
                sys.exit(f"soak: server did not start:\n{f.read()[-2000:]}")

    def proc_sample(self):
        """(VmRSS KiB, open fds, threads) of the server, or None once it is gone."""
        pid = self.proc.pid
        try:
            with open(f"/proc/{pid}/status") as f:
                st = f.read()
            rss = int(re.search(r"^VmRSS:\s+(\d+)", st, re.M).group(1))
            thr = int(re.search(r"^Threads:\s+(\d+)", st, re.M).group(1))
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            return rss, fds, thr
        except (OSError, AttributeError):
            return None

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request("GET", "/metrics")
            return c.getresponse().read().decode()
        finally:
            c.close()


def send(port, spec, stream, cancel_after):
    """Sends one request. Returns a dict: kind ('ok' | 'cancelled' | 'fail'), detail,
    choices {index: [text, finish_reason]}, usage (or None), status."""
    body = dict(spec["body"])
    if stream:
        body["stream"] = True
        if spec["include_usage"]:
            body["stream_options"] = {"include_usage": True}
    chat = spec["path"].endswith("chat/completions")
    res = {"kind": "fail", "detail": "", "choices": {}, "usage": None, "status": 0}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S)
    try:
        conn.request("POST", spec["path"], json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        res["status"] = r.status
        if r.status != 200:
            res["detail"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return res
        if not stream:
            j = json.loads(r.read())
            for c in j["choices"]:
                text = c["message"]["content"] if chat else c["text"]
                res["choices"][c["index"]] = [text or "", c["finish_reason"]]
            res["usage"] = j.get("usage")
            res["kind"] = "ok"
            return res
        events = 0
        while True:
            line = r.readline()
            if not line:
                res["detail"] = "stream closed before [DONE]"
                return res
            line = line.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                res["kind"] = "ok"
                return res
            j = json.loads(data)
            if "error" in j:
                res["detail"] = f"error event: {data[:200]}"
                return res
            if j.get("usage"):
                res["usage"] = j["usage"]
            for c in j.get("choices", []):
                slot = res["choices"].setdefault(c["index"], ["", None])
                piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
                slot[0] += piece or ""
                if c.get("finish_reason"):
                    slot[1] = c["finish_reason"]
            events += 1
            if cancel_after and events >= cancel_after:
                res["kind"] = "cancelled"
                return res  # the finally below closes the socket mid-stream
    except socket.timeout:
        res["detail"] = f"client timeout ({SOCKET_TIMEOUT_S:.0f} s of silence)"
        return res
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
        res["detail"] = f"{type(e).__name__}: {e}"
        return res
    finally:
        conn.close()


def compare(spec, ref, got):
    """'' when got agrees with the reference answer ref, else the difference."""
    n = spec["body"]["n"]
    if got["kind"] == "cancelled":
        for idx, (text, _) in got["choices"].items():
            if idx not in ref["choices"] or not ref["choices"][idx][0].startswith(text):
                return f"cancelled choice {idx} is not a prefix of the reference: {text!r:.80}"
        return ""
    if sorted(got["choices"]) != list(range(n)):
        return f"choice indexes {sorted(got['choices'])}, want 0..{n - 1}"
    for idx in range(n):
        if got["choices"][idx] != ref["choices"][idx]:
            return (f"choice {idx}: got {got['choices'][idx]!r:.120} want {ref['choices'][idx]!r:.120}")
    if got["usage"] is not None and ref["usage"] is not None:
        if got["usage"].get("completion_tokens") != ref["usage"].get("completion_tokens"):
            return f"usage.completion_tokens {got['usage'].get('completion_tokens')} " \
                   f"want {ref['usage'].get('completion_tokens')}"
    elif spec["stream"] and spec["include_usage"]:
        return "stream_options.include_usage: no usage chunk"
    return ""


def summarize(samples):
    return {"first": samples[0], "last": samples[-1], "peak": max(samples), "min": min(samples)}


def main():
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai", default=os.path.join(root, "build", "apps", "bonsai", "bonsai"))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--machine", default="", help="a note on the machine for the report (CPU generation...)")
    a = ap.parse_args()

    model = os.path.join(a.shared, "models", "stories260K", "stories260K.gguf")
    for f in (a.bonsai, model):
        if not os.path.exists(f):
            sys.exit(f"soak: missing {f}")
    work = tempfile.mkdtemp(prefix="bonsai_soak.")
    specs = make_requests(a.requests, a.seed)
    srv = Server(a.bonsai, model, a.pool_size, a.threads, work)
    lines = []
    ok = False

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    try:
        t0 = time.monotonic()
        idle_start = srv.proc_sample()
        # 1. References, one request at a time.
        refs = []
        for k, spec in enumerate(specs):
            ref = send(srv.port, spec, stream=False, cancel_after=0)
            if ref["kind"] != "ok":
                sys.exit(f"soak: reference for request {k} failed: {ref['detail']}")
            refs.append(ref)
            if (k + 1) % 1000 == 0:
                print(f"  references: {k + 1}/{len(specs)} ({time.monotonic() - t0:.0f} s)", flush=True)
        t_ref = time.monotonic() - t0
        distinct = len({json.dumps(r["choices"], sort_keys=True) for r in refs})
        # The server closes the reference connections as it sees their FINs
        # (up to its keep-alive poll): the idle baseline is taken once the fd
        # count is back to the start's (at most 15 s), not while the last
        # ones are still closing (a 1,000-request pass ends within seconds).
        idle_after_ref = srv.proc_sample()
        settle_ref = time.monotonic() + 15
        while (idle_after_ref is not None and idle_start is not None and idle_after_ref[1] > idle_start[1]
               and time.monotonic() < settle_ref):
            time.sleep(0.25)
            idle_after_ref = srv.proc_sample()

        # 2. The soak pass: all requests again, concurrently, shuffled.
        order = list(range(len(specs)))
        random.Random(a.seed + 1).shuffle(order)
        lock = threading.Lock()
        nxt = [0]
        results = [None] * len(specs)
        samples = []
        done = threading.Event()

        def sampler():
            while not done.is_set():
                s = srv.proc_sample()
                if s is None:
                    return
                samples.append((time.monotonic(), *s))
                done.wait(1.0)

        def worker():
            while True:
                with lock:
                    if nxt[0] >= len(order):
                        return
                    k = order[nxt[0]]
                    nxt[0] += 1
                spec = specs[k]
                results[k] = send(srv.port, spec, spec["stream"], spec["cancel_after"])

        t1 = time.monotonic()
        st = threading.Thread(target=sampler, daemon=True)
        st.start()
        ths = [threading.Thread(target=worker, daemon=True) for _ in range(a.clients)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        t_soak = time.monotonic() - t1
        done.set()
        st.join()
        # Idle again: the server closes the last connections as it sees the
        # clients' FINs (up to its keep-alive poll); give it 15 s to settle.
        settle_end = time.monotonic() + 15
        idle_end = srv.proc_sample()
        while idle_end is not None and idle_end[1] != idle_after_ref[1] and time.monotonic() < settle_end:
            time.sleep(0.25)
            idle_end = srv.proc_sample()
        settle_s = 15 - max(0.0, settle_end - time.monotonic())
        metrics = srv.metrics()
        alive = srv.proc.poll() is None

        # 3. Verdicts.
        fails, crosstalk, http5xx, cancelled = [], 0, 0, 0
        kinds = {"stream": 0, "nonstream": 0, "n>1": 0, "stop": 0, "cancel": 0, "chat": 0, "completions": 0,
                 "seeded": 0, "temp0": 0}
        for spec, ref, got in zip(specs, refs, results):
            b = spec["body"]
            kinds["stream" if spec["stream"] else "nonstream"] += 1
            kinds["n>1"] += b["n"] > 1
            kinds["stop"] += "stop" in b
            kinds["cancel"] += spec["cancel_after"] > 0
            kinds["chat" if spec["path"].endswith("chat/completions") else "completions"] += 1
            kinds["seeded" if "seed" in b else "temp0"] += 1
            if got is None:
                fails.append(f"#{spec['i']}: no result")
                continue
            if got["status"] >= 500:
                http5xx += 1
            if got["kind"] == "fail":
                fails.append(f"#{spec['i']} {spec['path']} stream={spec['stream']}: {got['detail']}")
                continue
            cancelled += got["kind"] == "cancelled"
            why = compare(spec, ref, got)
            if why:
                crosstalk += 1
                fails.append(f"#{spec['i']} {spec['path']} stream={spec['stream']} n={b['n']}: {why}")

        rss = [s[1] for s in samples]
        fds = [s[2] for s in samples]
        thr = [s[3] for s in samples]
        tenth = max(1, len(rss) // 10)
        rss_head, rss_tail = statistics.median(rss[:tenth]), statistics.median(rss[-tenth:])
        rss_flat = rss_tail <= rss_head * 1.05 + 4096
        fd_flat = idle_end is not None and idle_after_ref is not None and idle_end[1] == idle_after_ref[1]
        m = re.search(r"^bonsai_generations_cancelled_total(?:\{[^}]*\})?\s+(\S+)", metrics, re.M)
        server_cancelled = m.group(1) if m else "?"

        say(f"# bonsai soak: {len(specs)} mixed requests on stories260K, one server")
        say(f"date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
        say(f"machine: {cpu_model()}, {os.cpu_count()} cores ({cpu_flags()}), "
            f"{platform.system()} {platform.release()}{'; ' + a.machine if a.machine else ''}")
        say(f"command: bench/soak/soak.py --requests {a.requests} --clients {a.clients} "
            f"--pool-size {a.pool_size} --threads {a.threads} --seed {a.seed}")
        say(f"server: bonsai serve -m stories=stories260K.gguf --pool-size {a.pool_size} -t {a.threads} -c 1024")
        say(f"mix: {kinds}")
        say(f"reference pass (one at a time): {t_ref:.0f} s; distinct reference answers: {distinct} of {len(refs)}")
        say(f"soak pass ({a.clients} concurrent clients): {t_soak:.0f} s, {len(specs) / t_soak:.1f} requests/s")
        say(f"results: {sum(r is not None and r['kind'] == 'ok' for r in results)} complete, "
            f"{cancelled} cancelled by the client as planned (server counted {server_cancelled} "
            f"generations cancelled over both passes), {len(fails)} failures")
        say(f"cross-talk (answer != its reference): {crosstalk}")
        say(f"unexpected 5xx: {http5xx}")
        say(f"VmRSS KiB: idle before {idle_start[0]}, after references {idle_after_ref[0]}, "
            f"under load first {rss[0]} last {rss[-1]} peak {max(rss)} "
            f"(median first tenth {rss_head:.0f}, last tenth {rss_tail:.0f}), idle after {idle_end[0]}"
            f" -> {'flat' if rss_flat else 'GROWING'}")
        say(f"open fds: idle before {idle_start[1]}, after references {idle_after_ref[1]}, "
            f"under load first {fds[0]} last {fds[-1]} peak {max(fds)}, idle after {idle_end[1]} "
            f"(settled {settle_s:.1f} s after the last answer)"
            f" -> {'flat' if fd_flat else 'NOT FLAT'}")
        say(f"threads: idle before {idle_start[2]}, under load peak {max(thr)}, idle after {idle_end[2]}")
        say(f"server alive at the end: {alive}")
        for f in fails[:20]:
            say(f"  FAIL {f}")
        ok = alive and not fails and http5xx == 0 and crosstalk == 0 and rss_flat and fd_flat
        say(f"verdict: {'PASS' if ok else 'FAIL'}")
        # RSS / fd series, one row per 10 s, for the record.
        say("series (s since soak start, VmRSS KiB, fds, threads):")
        for s in samples[::10]:
            say(f"  {s[0] - t1:6.0f} {s[1]:8d} {s[2]:5d} {s[3]:4d}")
    finally:
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGTERM)
            try:
                srv.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.proc.kill()
                srv.proc.wait()
        print(f"server exit status: {srv.proc.returncode}")
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"server logs kept in {work}")

    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {a.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
