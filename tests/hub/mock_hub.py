#!/usr/bin/env python3
"""A local stand-in for the Hugging Face Hub's HTTP endpoints (loopback only),
for bonsai's -hf / pull tests (tests/hub/hub_test.sh). It serves the files
under --root/OWNER/NAME/... as model repositories:

  GET  /api/models/OWNER/NAME                       model info {id, sha, siblings}
  GET  /api/models/OWNER/NAME/tree/REV?recursive=.. [{type, path, size, oid, lfs: {oid, size}}]
  HEAD/GET /OWNER/NAME/resolve/REV/PATH             *.gguf (LFS): 302 to the "CDN" (a second
       port, so another origin) with X-Repo-Commit, X-Linked-Etag (sha256), X-Linked-Size;
       other files: 200 with ETag (git blob sha1) and X-Repo-Commit
  GET  CDN /blob/SHA256                             the bytes, with Range: bytes=N- (206)

Errors as the Hub answers them: 404 with X-Error-Code RepoNotFound /
EntryNotFound / RevisionNotFound; 401 when --token is set and the request to
the hub port lacks "Authorization: Bearer TOKEN".

Switches: --drop-after N (the first CDN GET of each blob sends its headers
for the whole body, then N bytes, then closes the connection), --wrong-sha
(the tree's lfs.oid and X-Linked-Etag are a sha256 the bytes do not have),
--claim-size N (the tree's lfs.size and X-Linked-Size of *.gguf files say N
bytes: a file larger than the disk).
Every request is logged as a JSON line to --log: {port: "hub"|"cdn", method,
path, range, auth} where auth is whether an Authorization header came.
The ports are written to --port-file as "HUB CDN" once both listen.
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
log_lock = threading.Lock()
dropped = set()  # blobs whose first GET was cut (--drop-after)
cdn_port = 0


def log(entry):
    if not args.log:
        return
    with log_lock, open(args.log, "a") as f:
        f.write(json.dumps(entry) + "\n")


def commit_of(repo):
    return hashlib.sha1(("commit:" + repo).encode()).hexdigest()


def repo_files(repo):
    """{path: (abs path, size, sha256, git sha1)} of a repository, or None."""
    root = os.path.join(args.root, repo)
    if not os.path.isdir(root) or repo.count("/") != 1:
        return None
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in sorted(names):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            data = open(full, "rb").read()
            sha = hashlib.sha256(data).hexdigest()
            if args.wrong_sha:
                sha = hashlib.sha256(b"not these bytes" + data).hexdigest()
            git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            out[rel] = (full, len(data), sha, git)
    return out


def blob_path(sha):
    for dirpath, _, names in os.walk(args.root):
        for n in names:
            full = os.path.join(dirpath, n)
            data = open(full, "rb").read()
            s = hashlib.sha256(data).hexdigest()
            if args.wrong_sha:
                s = hashlib.sha256(b"not these bytes" + data).hexdigest()
            if s == sha:
                return full
    return None


class Handler(BaseHTTPRequestHandler):
    is_cdn = False

    def log_message(self, *a):
        pass

    def reply(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, msg):
        self.reply(status, json.dumps({"error": msg}).encode(), {"X-Error-Code": code} if code else {})

    def handle_any(self):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        log({"port": "cdn" if self.is_cdn else "hub", "method": self.command, "path": path,
             "range": self.headers.get("Range"), "auth": self.headers.get("Authorization") is not None})
        if self.is_cdn:
            return self.serve_blob(path)
        if args.token and self.headers.get("Authorization") != "Bearer " + args.token:
            return self.error(401, None, "Invalid credentials in Authorization header")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            files = repo_files(repo)
            if files is None:
                return self.error(404, "RepoNotFound", "Repository not found")
            if len(parts) == 4:
                info = {"id": repo, "sha": commit_of(repo), "siblings": [{"rfilename": p} for p in files]}
                return self.reply(200, json.dumps(info).encode())
            if len(parts) >= 6 and parts[4] == "tree":
                if parts[5] != "main":
                    return self.error(404, "RevisionNotFound", "Revision not found")
                tree = []
                for p, (_, size, sha, git) in files.items():
                    e = {"type": "file", "path": p, "size": size, "oid": git}
                    if p.endswith(".gguf"):
                        e["lfs"] = {"oid": sha, "size": args.claim_size or size, "pointerSize": 134}
                    tree.append(e)
                return self.reply(200, json.dumps(tree).encode())
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = "/".join(parts[:2])
            files = repo_files(repo)
            if files is None:
                return self.error(404, "RepoNotFound", "Repository not found")
            if parts[3] != "main":
                return self.error(404, "RevisionNotFound", "Revision not found")
            rel = "/".join(parts[4:])
            if rel not in files:
                return self.error(404, "EntryNotFound", "Entry not found")
            full, size, sha, git = files[rel]
            common = {"X-Repo-Commit": commit_of(repo)}
            if rel.endswith(".gguf"):
                loc = "http://127.0.0.1:%d/blob/%s" % (cdn_port, sha)
                common.update({"X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(args.claim_size or size),
                               "Location": loc,
                               "ETag": '"%s"' % git})
                return self.reply(302, b"", common)
            common["ETag"] = '"%s"' % git
            if self.command == "HEAD":
                self.send_response(200)
                for k, v in common.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                return
            return self.reply(200, open(full, "rb").read(), common, "application/octet-stream")
        return self.error(404, None, "not found")

    def serve_blob(self, path):
        parts = path.strip("/").split("/")
        full = blob_path(parts[1]) if len(parts) == 2 and parts[0] == "blob" else None
        if full is None:
            return self.error(404, None, "no such blob")
        data = open(full, "rb").read()
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= len(data):
                return self.reply(416, b"", {"Content-Range": "bytes */%d" % len(data)})
        body = data[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if args.drop_after and parts[1] not in dropped and len(body) > args.drop_after:
            dropped.add(parts[1])
            self.wfile.write(body[:args.drop_after])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    do_GET = handle_any
    do_HEAD = handle_any


class CdnHandler(Handler):
    is_cdn = True


def main():
    global args, cdn_port
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--log")
    p.add_argument("--token")
    p.add_argument("--drop-after", type=int, default=0)
    p.add_argument("--wrong-sha", action="store_true")
    p.add_argument("--claim-size", type=int, default=0)
    args = p.parse_args()
    hub = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    cdn = ThreadingHTTPServer(("127.0.0.1", 0), CdnHandler)
    cdn_port = cdn.server_address[1]
    threading.Thread(target=cdn.serve_forever, daemon=True).start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (hub.server_address[1], cdn_port))
    os.rename(tmp, args.port_file)
    try:
        hub.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
