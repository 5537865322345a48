#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub and its storage (test_remote_hf.c).

usage: hf_hub_server.py PORT ROOT

Two listeners on 127.0.0.1: the Hub on PORT and its "storage" on a port
of its own (GET /ctl/storage gives it). ROOT holds ORG/NAME/COMMIT/FILES
(COMMIT: 40 hex digits) and ORG/NAME/refs/BRANCH (a file holding the
commit the branch names); ORG/NAME/token, when present, makes the
repository private (its content is the Bearer token it accepts);
ORG/NAME/gated makes it gated (its API answers anyone, its resolve only
that Bearer token: 401 without one, 403 GatedRepo with another);
ORG/NAME/nolfs lists files (one a line) that are no Git LFS objects: the
API lists no "lfs" for them, resolve answers no X-Linked-Etag.

The Hub answers what sluice asks of the real one:
    GET /api/models/ORG/NAME                       the repository (200, 401, 404)
    GET /api/models/ORG/NAME/revision/REV?blobs=true
        {"id", "sha", "siblings": [{"rfilename", "size", "lfs": {"sha256",
        "size", "pointerSize"}}]} (lfs for .safetensors files only);
        401 RepoNotFound without a token (as the Hub does for a missing or
        private repository), 404 with one; 404 RevisionNotFound
    GET /ORG/NAME/resolve/REV/FILE
        a .safetensors file: 302 to the storage
        (http://localhost:SPORT/blob/ORG/NAME/COMMIT/FILE?X-Amz-Signature=...)
        with X-Linked-Etag and X-Linked-Size (412 to an If-Match other than
        that ETag: the strictest a Hub could be); any other: 200 with the bytes;
        404 EntryNotFound / RevisionNotFound
The storage serves /blob/... with single byte ranges (206, Content-Range,
ETag). Control, on the Hub's port:
    GET /ctl/storage        the storage's port
    GET /ctl/log            one line a request:
                            "hub|storage METHOD PATH if-match=VALUE range=VALUE auth=VALUE"
    GET /ctl/clear          empties the log
    GET /ctl/flip?at=N      the storage flips byte N of every file it serves
    GET /ctl/flip?at=N&times=K
                            ... of the first K responses that hold byte N
                            only (K=1: a header served once, then the truth)
    GET /ctl/sha?value=C     the API answers commit C as "sha" whatever was
                            asked, and C's files (a Hub that lies); no value:
                            the truth
    GET /ctl/lfs?value=H    the Hub publishes H as the SHA-256 of every
                            .safetensors file (the API's lfs.sha256 and
                            resolve's X-Linked-Etag: a wrong digest);
                            "none": publishes none (a file that is no
                            LFS object); no value: the truth
    GET /ctl/storage_base?url=BASE
                            resolve's 302 goes to BASE/blob/... instead of
                            the storage (another server: a look-alike host
                            of the Hub's); no url: the storage again
"""
import hashlib
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlparse

ROOT = "."
STATE = {"log": [], "flip": -1, "flip_times": -1, "storage_port": 0, "storage_base": "", "sha": "", "lfs": ""}
LOCK = threading.Lock()
HEX40 = re.compile(r"^[0-9a-f]{40}$")


def log(who, handler):
    with LOCK:
        STATE["log"].append("%s %s %s if-match=%s range=%s auth=%s" % (
            who, handler.command, handler.path, handler.headers.get("If-Match", ""),
            handler.headers.get("Range", ""), handler.headers.get("Authorization", "")))


def repo_dir(org, name):
    d = os.path.join(ROOT, org, name)
    return d if os.path.isdir(d) else None


def allowed(handler, d):
    tok = os.path.join(d, "token")
    if not os.path.exists(tok):
        return True
    with open(tok) as f:
        want = f.read().strip()
    return handler.headers.get("Authorization", "") == "Bearer " + want


def commit_of(d, rev):
    rev = unquote(rev)
    if HEX40.match(rev) and os.path.isdir(os.path.join(d, rev)):
        return rev
    ref = os.path.join(d, "refs", rev.replace("/", "%2F"))
    if os.path.isfile(ref):
        with open(ref) as f:
            return f.read().strip()
    return None


def not_lfs(d):
    """The files of repository d that are no Git LFS objects (ORG/NAME/nolfs)."""
    p = os.path.join(d, "nolfs")
    if not os.path.isfile(p):
        return set()
    with open(p) as f:
        return {line.strip() for line in f if line.strip()}


def published_sha256(path):
    """What the Hub publishes as a file's SHA-256 (lfs.sha256, X-Linked-Etag)."""
    return STATE["lfs"] or sha256_of(path)


SHA_MEMO = {}


def sha256_of(path):
    """The file's SHA-256, remembered while its size and mtime stay (a
    large file is asked for on every resolve)."""
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    with LOCK:
        if key in SHA_MEMO:
            return SHA_MEMO[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    with LOCK:
        SHA_MEMO[key] = h.hexdigest()
    return SHA_MEMO[key]


def files_of(top):
    out = []
    for dirpath, _, names in os.walk(top):
        for n in names:
            p = os.path.join(dirpath, n)
            out.append((os.path.relpath(p, top), p))
    return sorted(out)


class Hub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, status, body=b"", headers=None):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, msg):
        self.answer(status, json.dumps({"error": msg}).encode(),
                    {"X-Error-Code": code, "X-Error-Message": msg,
                     "Content-Type": "application/json"})

    def repo_or_error(self, org, name):
        d = repo_dir(org, name)
        if d is None or not allowed(self, d):
            if self.headers.get("Authorization"):
                self.error(404, "RepoNotFound", "Repository not found")
            else:
                self.error(401, "RepoNotFound", "Invalid username or password.")
            return None
        return d

    def do_GET(self):
        u = urlparse(self.path)
        parts = [p for p in u.path.split("/") if p]
        if parts[:1] == ["ctl"]:
            return self.control(parts, u.query)
        log("hub", self)
        if parts[:2] == ["api", "models"] and len(parts) in (4, 6):
            d = self.repo_or_error(parts[2], parts[3])
            if d is None:
                return
            rev = parts[5] if len(parts) == 6 and parts[4] == "revision" else "main"
            commit = commit_of(d, rev)
            if commit is None:
                return self.error(404, "RevisionNotFound", "Invalid rev id: " + unquote(rev))
            sib = []
            nolfs = not_lfs(d)
            if STATE["sha"] and os.path.isdir(os.path.join(d, STATE["sha"])):
                commit = STATE["sha"]   # a consistent lie: that commit's files
            for rel, p in files_of(os.path.join(d, commit)):
                e = {"rfilename": rel, "size": os.path.getsize(p), "blobId": "0" * 40}
                if rel.endswith(".safetensors") and STATE["lfs"] != "none" and rel not in nolfs:
                    e["lfs"] = {"sha256": published_sha256(p), "size": os.path.getsize(p),
                                "pointerSize": 134}
                sib.append(e)
            body = {"id": parts[2] + "/" + parts[3], "sha": STATE["sha"] or commit,
                    "siblings": sib}
            return self.answer(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
        if len(parts) >= 5 and parts[2] == "resolve":
            d = self.repo_or_error(parts[0], parts[1])
            if d is None:
                return
            # a gated repository (ORG/NAME/gated holds the token that has
            # access): its API answers anyone, its files only that token
            gated = os.path.join(d, "gated")
            if os.path.exists(gated):
                with open(gated) as f:
                    want = f.read().strip()
                auth = self.headers.get("Authorization", "")
                if auth != "Bearer " + want:
                    return self.error(403 if auth else 401, "GatedRepo",
                                      "Access to model is restricted")
            commit = commit_of(d, parts[3])
            if commit is None:
                return self.error(404, "RevisionNotFound", "Invalid rev id")
            rel = "/".join(unquote(p) for p in parts[4:])
            p = os.path.join(d, commit, rel)
            if ".." in rel or not os.path.isfile(p):
                return self.error(404, "EntryNotFound", "Entry not found")
            if rel.endswith(".safetensors"):
                # the worst a Hub could do with the If-Match of a range
                # request: judge it against its own reply's ETag
                im = self.headers.get("If-Match")
                if im and im != '"%s"' % published_sha256(p):
                    return self.error(412, "PreconditionFailed", "If-Match")
                base = STATE["storage_base"] or "http://localhost:%d" % STATE["storage_port"]
                loc = "%s/blob/%s/%s/%s/%s?X-Amz-Signature=s%%3D1" % (
                    base, parts[0], parts[1], commit, quote(rel))
                hdr = {"Location": loc, "X-Repo-Commit": commit}
                if STATE["lfs"] != "none" and rel not in not_lfs(d):
                    hdr["X-Linked-Etag"] = '"%s"' % published_sha256(p)
                    hdr["X-Linked-Size"] = str(os.path.getsize(p))
                return self.answer(302, b"", hdr)
            with open(p, "rb") as f:
                return self.answer(200, f.read(), {"X-Repo-Commit": commit,
                                                   "ETag": '"%s"' % hashlib.sha1(
                                                       open(p, "rb").read()).hexdigest()})
        self.error(404, "EntryNotFound", "no such path")

    def control(self, parts, query):
        if parts == ["ctl", "storage"]:
            return self.answer(200, str(STATE["storage_port"]).encode())
        if parts == ["ctl", "log"]:
            with LOCK:
                return self.answer(200, ("\n".join(STATE["log"]) + "\n").encode())
        if parts == ["ctl", "clear"]:
            with LOCK:
                STATE["log"] = []
            return self.answer(200, b"ok")
        if parts == ["ctl", "sha"]:
            STATE["sha"] = parse_qs(query).get("value", [""])[0]
            return self.answer(200, b"ok")
        if parts == ["ctl", "lfs"]:
            STATE["lfs"] = parse_qs(query).get("value", [""])[0]
            return self.answer(200, b"ok")
        if parts == ["ctl", "storage_base"]:
            STATE["storage_base"] = parse_qs(query).get("url", [""])[0]
            return self.answer(200, b"ok")
        if parts == ["ctl", "flip"]:
            q = parse_qs(query)
            STATE["flip"] = int(q["at"][0])
            STATE["flip_times"] = int(q.get("times", ["-1"])[0])
            return self.answer(200, b"ok")
        self.answer(404)


class Storage(Hub):
    def do_GET(self):
        log("storage", self)
        u = urlparse(self.path)
        parts = [unquote(p) for p in u.path.split("/") if p]
        if parts[:1] != ["blob"] or ".." in parts or "X-Amz-Signature" not in u.query:
            return self.answer(403, b"signature")
        p = os.path.join(ROOT, *parts[1:])
        if not os.path.isfile(p):
            return self.answer(404)
        size = os.path.getsize(p)
        etag = '"st-%s"' % sha256_of(p)[:16]
        m = re.match(r"bytes=(\d+)-(\d+)$", self.headers.get("Range", ""))
        lo, hi = (int(m.group(1)), min(int(m.group(2)), size - 1)) if m else (0, size - 1)
        if m and lo >= size:
            return self.answer(416, b"", {"Content-Range": "bytes */%d" % size})
        with open(p, "rb") as f:
            f.seek(lo)
            body = bytearray(f.read(hi - lo + 1))
        with LOCK:
            at = STATE["flip"]
            flip = lo <= at <= hi and STATE["flip_times"] != 0
            if flip and STATE["flip_times"] > 0:
                STATE["flip_times"] -= 1
        if flip:
            body[at - lo] ^= 0x01
        hdr = {"ETag": etag, "Accept-Ranges": "bytes"}
        if m:
            hdr["Content-Range"] = "bytes %d-%d/%d" % (lo, hi, size)
        self.answer(206 if m else 200, bytes(body), hdr)


def main():
    global ROOT
    port, ROOT = int(sys.argv[1]), sys.argv[2]
    storage = ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    STATE["storage_port"] = storage.server_address[1]
    threading.Thread(target=storage.serve_forever, daemon=True).start()
    hub = ThreadingHTTPServer(("127.0.0.1", port), Hub)
    hub.daemon_threads = True
    hub.serve_forever()


if __name__ == "__main__":
    main()
