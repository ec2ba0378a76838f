#!/usr/bin/env python3
"""Scale-out test (ctest: server_scaleout_test, label "slow"): nginx in front of
three `bonsai serve` workers on loopback, a worker killed and restarted under load.

  scaleout_test.py BONSAI_BINARY SHARED_DIR [--seconds 120] [--clients 6] [--keep]

What it does:
  1. starts 3 workers (`bonsai serve -m stories=stories260K.gguf -t 1 --pool-size 2`)
     on free loopback ports and waits for each one's GET /health;
  2. starts nginx (Debian's package) as an unprivileged configuration in a temp
     folder (its own pid file, error/access logs and temp paths, `daemon off`):
     `least_conn`, passive health checks (max_fails / fail_timeout),
     `proxy_next_upstream error timeout` (a refused connection is retried on the
     next worker) and `proxy_buffering off` (SSE passes through as produced);
     the same configuration as docs/deploy.md, with the ports filled in;
  3. runs a mixed load through nginx for --seconds: --clients threads, each
     looping over /v1/completions and /v1/chat/completions, streamed or not,
     n = 1 or 2, stop strings, temperature 0 or 0.8 with a seed;
  4. at 35% of the run SIGKILLs worker 2, at 50% restarts it on the same port.

It passes when:
  - no request hangs: every socket operation has a 20 s timeout and a request
    that hits it counts as a failure (nginx's own upstream timeouts are 30 s);
  - every request completes (HTTP 200; a non-streamed body with choices and
    finish_reason; a stream whose events all parse and that ends with
    `data: [DONE]`) or, only if it was in flight when the worker was killed,
    gets a clean error (a 502/503/504 answer, or a connection / stream closed
    early); nothing else (4xx, 500, malformed JSON) is allowed;
  - every request started after the kill succeeds (nginx routes around the dead
    worker and, after fail_timeout, back to the restarted one);
  - every worker served completions before the kill (its /metrics counter), the
    restarted worker serves at least MIN_REJOIN completions after its restart
    (its own bonsai_http_requests_total, which starts from zero in the new
    process), and the two surviving workers never die;
  - at the end each worker exits 0 on SIGTERM and nginx on SIGQUIT.

Exit 0 pass, 1 fail, 77 skip (fixture or nginx missing and CI is not "true").
Python standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SOCKET_TIMEOUT_S = 20.0   # client side: a request silent this long counts as hung
MIN_REJOIN = 10           # completions the restarted worker must serve
PROMPTS = [
    "Once upon a time", "The little dog", "Lily went to the park", "One day, a big bird",
    "Tom had a red ball", "The sun was hot and", "Sara liked to read", "A small cat named Tim",
]
COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions")


def skip_or_fail(msg):
    if os.environ.get("CI") == "true":
        print(f"FAIL: {msg}")
        sys.exit(1)
    print(f"SKIP: {msg}")
    sys.exit(77)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get(port, path, timeout=5.0):
    """GET 127.0.0.1:port/path -> (status, body text); raises OSError on a connection error."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def wait_health(port, proc, seconds=30.0):
    """True once GET /health answers 200 (False if proc exits or time runs out)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            if http_get(port, "/health", timeout=2.0)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def completions_served(port):
    """Sum of bonsai_http_requests_total over the completion routes with status 200."""
    status, text = http_get(port, "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics on :{port} answered {status}")
    total = 0.0
    for line in text.splitlines():
        m = re.match(r'bonsai_http_requests_total\{([^}]*)\}\s+([0-9.eE+-]+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("route") in COMPLETION_ROUTES and labels.get("status") == "200":
            total += float(m.group(2))
    return int(total)


class Worker:
    """One `bonsai serve` process on a fixed loopback port (restartable on the same port)."""

    def __init__(self, binary, model, port, workdir, index):
        self.binary, self.model, self.port = binary, model, port
        self.workdir, self.index, self.proc, self.starts = workdir, index, None, 0

    def start(self):
        self.starts += 1
        base = os.path.join(self.workdir, f"worker{self.index}.{self.starts}")
        cmd = [self.binary, "serve", "-m", f"stories={self.model}", "--host", "127.0.0.1",
               "--port", str(self.port), "-t", "1", "--pool-size", "2", "-c", "512"]
        # A freshly killed worker's port can take a moment to be bindable again.
        for _ in range(20):
            with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=err)
            if wait_health(self.port, self.proc):
                return
            if self.proc.poll() is None:
                break
            time.sleep(0.25)
        raise RuntimeError(f"worker {self.index} did not start on :{self.port}; see {base}.err")


NGINX_CONF = """\
# Generated by scaleout_test.py; the same settings as docs/deploy.md.
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log notice;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    log_format upstream '$msec $status $request_time "$request" upstream=$upstream_addr '
                        'upstream_status=$upstream_status';
    access_log {work}/access.log upstream;

    upstream bonsai {{
        least_conn;
{servers}
        keepalive 16;
        keepalive_timeout 3s;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 8m;
        location / {{
            proxy_pass http://bonsai;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_connect_timeout 2s;
            proxy_send_timeout 30s;
            proxy_read_timeout 30s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
            proxy_next_upstream_timeout 10s;
        }}
    }}
}}
"""


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.records = []  # (start, end, kind, detail, route, stream)

    def add(self, *rec):
        with self.lock:
            self.records.append(rec)


def make_request(rng, nonce):
    """A random mixed request: (path, body dict, stream)."""
    stream = rng.random() < 0.5
    body = {"model": "stories", "max_tokens": rng.choice([8, 16, 32, 64]), "stream": stream}
    prompt = f"{rng.choice(PROMPTS)} {nonce}"
    if rng.random() < 0.5:
        path = "/v1/completions"
        body["prompt"] = prompt
    else:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
    if rng.random() < 0.25:
        body["n"] = 2
    if rng.random() < 0.25:
        body["stop"] = [rng.choice([".", " the", "\n"])]
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body["temperature"] = 0.8
        body["seed"] = rng.randrange(1 << 30)
    return path, body, stream


def check_answer(body, stream, n):
    """'' when the 200 body is a complete answer, else what is wrong with it."""
    if not stream:
        try:
            j = json.loads(body)
        except ValueError:
            return "non-streamed body is not JSON"
        ch = j.get("choices")
        if not isinstance(ch, list) or len(ch) != n:
            return f"want {n} choices, got {ch!r:.80}"
        if any(c.get("finish_reason") not in ("stop", "length") for c in ch):
            return "a choice without finish_reason stop/length"
        return ""
    events = [ln[6:] for ln in body.split("\n") if ln.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "stream_truncated"  # closed before [DONE]: a clean error, judged by the caller
    finished = set()
    for e in events[:-1]:
        try:
            j = json.loads(e)
        except ValueError:
            return f"event is not JSON: {e[:80]}"
        if "error" in j:
            return "stream_error_event"
        for c in j.get("choices", []):
            if c.get("finish_reason"):
                finished.add(c.get("index", 0))
    if len(finished) != n:
        return f"finish_reason seen for {len(finished)} of {n} choices"
    return ""


def client_loop(port, seed, stop_at, stats, stop_flag):
    rng = random.Random(seed)
    k = 0
    while time.monotonic() < stop_at and not stop_flag.is_set():
        k += 1
        path, body, stream = make_request(rng, f"[{seed}-{k}]")
        n = body.get("n", 1)
        t0 = time.monotonic()
        kind, detail = "ok", ""
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read().decode("utf-8", "replace")
            if r.status == 200:
                why = check_answer(data, stream, n)
                if why in ("stream_truncated", "stream_error_event"):
                    kind, detail = "clean_error", why
                elif why:
                    kind, detail = "bad", why
            elif r.status in (502, 503, 504):
                kind, detail = "clean_error", f"HTTP {r.status}"
            else:
                kind, detail = "bad", f"HTTP {r.status}: {data[:200]}"
        except socket.timeout:
            kind, detail = "hang", f"no data for {SOCKET_TIMEOUT_S:.0f} s"
        except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError) as e:
            kind, detail = "clean_error", type(e).__name__
        except (OSError, http.client.HTTPException) as e:
            kind, detail = "bad", f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        stats.add(t0, time.monotonic(), kind, detail, path, stream)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("shared")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("BONSAI_SCALEOUT_SECONDS", 120)))
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    a = ap.parse_args()

    model = os.path.join(a.shared, "models", "stories260K", "stories260K.gguf")
    if not os.path.isfile(model):
        skip_or_fail(f"missing fixture {model}")
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        skip_or_fail("nginx is not installed (scripts/test.sh installs it: apt-get install nginx)")

    work = tempfile.mkdtemp(prefix="bonsai_scaleout.")
    # nginx's worker processes run as 'nobody' when started by root: let them in.
    os.chmod(work, 0o755)
    workers, nginx_proc = [], None
    failures = []

    def fail(msg):
        failures.append(msg)
        print(f"not ok - {msg}")

    try:
        ports = [free_port() for _ in range(4)]
        lb_port = ports[3]
        for i in range(3):
            w = Worker(a.binary, model, ports[i], work, i + 1)
            w.start()
            workers.append(w)
        print(f"workers on :{ports[0]} :{ports[1]} :{ports[2]}")

        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=3s;" for p in ports[:3])
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(work=work, servers=servers, port=lb_port))
        with open(os.path.join(work, "nginx.out"), "wb") as out:
            nginx_proc = subprocess.Popen([nginx, "-p", work, "-e", os.path.join(work, "error.log"),
                                           "-c", conf], stdout=out, stderr=subprocess.STDOUT)
        if not wait_health(lb_port, nginx_proc, 15.0):
            with open(os.path.join(work, "error.log"), errors="replace") as f:
                print(f.read()[-2000:])
            raise RuntimeError("nginx did not start (error log above)")
        print(f"nginx on :{lb_port} (pid {nginx_proc.pid})")

        stats, stop_flag = Stats(), threading.Event()
        t_start = time.monotonic()
        stop_at = t_start + a.seconds
        threads = [threading.Thread(target=client_loop, args=(lb_port, 1000 + i, stop_at, stats, stop_flag),
                                    daemon=True) for i in range(a.clients)]
        for t in threads:
            t.start()

        victim = workers[1]
        time.sleep(max(0.0, t_start + 0.35 * a.seconds - time.monotonic()))
        before = [completions_served(w.port) for w in workers]
        t_kill_sent = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        t_kill = time.monotonic()  # the worker is gone: its sockets are closed
        print(f"t={t_kill - t_start:.1f}s: SIGKILL worker 2 (:{victim.port}); "
              f"completions served so far per worker: {before}")
        for i, c in enumerate(before):
            if c <= 0:
                fail(f"worker {i + 1} served no completions before the kill (least_conn should spread)")

        time.sleep(max(0.0, t_start + 0.5 * a.seconds - time.monotonic()))
        victim.start()
        t_restart = time.monotonic()
        print(f"t={t_restart - t_start:.1f}s: worker 2 restarted (pid {victim.proc.pid}), /health 200")

        # The clients stop themselves at stop_at; a thread alive long after
        # that is stuck in a request (its socket timeout should have fired).
        for t in threads:
            t.join(timeout=max(0.0, stop_at - time.monotonic()) + 3 * SOCKET_TIMEOUT_S)
        stop_flag.set()
        if any(t.is_alive() for t in threads):
            fail("a client thread is still inside a request long after its timeout (hung)")
        after = [completions_served(w.port) for w in workers]
        print(f"completions served per worker at the end: {after} (worker 2 counts since its restart)")

        # Verdicts.
        recs = list(stats.records)
        by_kind = {}
        for r in recs:
            by_kind[r[2]] = by_kind.get(r[2], 0) + 1
        print(f"requests: {len(recs)} total, {by_kind}")
        def was_in_flight(r):  # started before the worker was gone, ended after the signal
            return r[0] < t_kill and r[1] >= t_kill_sent
        in_flight = [r for r in recs if was_in_flight(r)]
        after_kill = [r for r in recs if r[0] >= t_kill]
        after_restart = [r for r in recs if r[0] >= t_restart]
        print(f"in flight at the kill: {len(in_flight)}; started after the kill: {len(after_kill)} "
              f"({sum(r[2] == 'ok' for r in after_kill)} ok); after the restart: {len(after_restart)}")
        for r in recs:
            if r[2] == "hang":
                fail(f"hung request {r[4]} stream={r[5]} at t={r[0] - t_start:.1f}s: {r[3]}")
            elif r[2] == "bad":
                fail(f"bad answer {r[4]} stream={r[5]} at t={r[0] - t_start:.1f}s: {r[3]}")
            elif r[2] == "clean_error" and not was_in_flight(r):
                fail(f"error not explained by the kill {r[4]} stream={r[5]} at "
                     f"t={r[0] - t_start:.1f}s..{r[1] - t_start:.1f}s: {r[3]}")
        if not after_kill or not after_restart:
            fail("no requests after the kill / restart (load too slow?)")
        if after[1] < MIN_REJOIN:
            fail(f"restarted worker served {after[1]} completions (want >= {MIN_REJOIN}): did not rejoin")
        for i in (0, 2):
            if workers[i].proc.poll() is not None:
                fail(f"worker {i + 1} died (exit {workers[i].proc.returncode})")
            elif after[i] <= before[i]:
                fail(f"worker {i + 1} served nothing after the kill")
        errors = [r[3] for r in recs if r[2] == "clean_error"]
        if errors:
            print(f"clean errors (all in flight at the kill): {sorted(set(errors))} x{len(errors)}")

        # nginx's view: retried requests (two upstream addresses) and the upstreams used.
        retried, used = 0, {}
        with open(os.path.join(work, "access.log"), errors="replace") as f:
            for line in f:
                m = re.search(r'upstream=(\S.*?) upstream_status=', line)
                if not m:
                    continue
                addrs = [x.strip() for x in re.split(r"[,:]\s", m.group(1)) if x.strip()]
                if len(addrs) > 1:
                    retried += 1
                used[addrs[-1]] = used.get(addrs[-1], 0) + 1
        print(f"nginx: {retried} requests retried on another worker; final upstream counts {used}")

        # Orderly end: each worker exits 0 on SIGTERM, nginx on SIGQUIT.
        for i, w in enumerate(workers):
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
                try:
                    rc = w.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    rc = "timeout"
                if rc != 0:
                    fail(f"worker {i + 1} exit status on SIGTERM: {rc}")
        nginx_proc.send_signal(signal.SIGQUIT)
        try:
            rc = nginx_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0:
            fail(f"nginx exit status on SIGQUIT: {rc}")
        with open(os.path.join(work, "error.log"), errors="replace") as f:
            bad_lines = [ln for ln in f if "[emerg]" in ln or "[alert]" in ln or "[crit]" in ln]
        if bad_lines:
            fail(f"nginx error log: {bad_lines[:3]}")
    except RuntimeError as e:
        fail(str(e))
    finally:
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        if nginx_proc is not None and nginx_proc.poll() is None:
            # SIGTERM (fast shutdown) lets the master stop its worker process too.
            nginx_proc.terminate()
            try:
                nginx_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                nginx_proc.kill()
                nginx_proc.wait()
        if a.keep or failures:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    if failures:
        print(f"FAIL: {len(failures)} problem(s)")
        return 1
    print("PASS: scale-out behind nginx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
