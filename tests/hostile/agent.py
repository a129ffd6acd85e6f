"""A malicious sbxfs agent for tests/untrusted_mount.rs: answers /v1/info properly, then
hostile answers (an endless body to a read, a size of 2^63 - 1, a listing of millions of
entries, impossible names, search results naming laptop files). Prints its port on stdout once listening."""
import json
import os
import sys
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

ATTR = {"mode": 0o755, "uid": 0, "gid": 0, "atime_ns": 0, "mtime_ns": 0, "ctime_ns": 0,
        "dev": 1, "nlink": 1}


def attr(kind, size, ino):
    # Versions name the file, as the real agent's do (the page cache is keyed by them).
    return dict(ATTR, kind=kind, size=size, ino=ino, version="v%d" % ino)


FILES = {
    "": attr("dir", 4096, 1),
    "endless": attr("file", 1 << 20, 2),
    "huge_size": attr("file", (1 << 63) - 1, 3),
    "many": attr("dir", 4096, 4),
    "slash": attr("dir", 4096, 5),
    "dotdot": attr("dir", 4096, 6),
    "fine.txt": attr("file", 6, 7),
    "flapping": attr("file", 6, 8),
    "redirected": attr("file", 6, 9),
    "badtree": attr("dir", 4096, 10),
    "bigtree": attr("dir", 4096, 11),
    "bombtree": attr("dir", 4096, 12),
}
READS = [0]
CHUNK = 1 << 20


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def json(self, value, status=200):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def until_close(self, chunks, headers=()):
        """A body without a length, ended by closing the connection."""
        self.send_response(200)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for c in chunks:
                self.wfile.write(c)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        path = q.get("path", [""])[0]
        op = url.path.removeprefix("/v1/")
        if op == "info":
            if "HOSTILE_VERSION" in os.environ:
                # Another protocol, and a version that is a terminal escape.
                return self.json({"protocol": 999, "agent_version": os.environ["HOSTILE_VERSION"],
                                  "root": "/ws"})
            return self.json({"protocol": 2, "agent_version": "hostile", "root": "/ws"})
        if op == "stat":
            if path in FILES:
                return self.json(FILES[path])
            return self.json({"error": "ENOENT", "message": path}, 404)
        if op == "list":
            if path == "":
                names = [n for n in FILES if n]
                return self.json({"entries": [{"name": n, "attr": FILES[n]} for n in names]})
            if path == "slash":
                return self.json({"entries": [{"name": "a/b", "attr": FILES["fine.txt"]}]})
            if path == "dotdot":
                return self.json({"entries": [{"name": "..", "attr": FILES["fine.txt"]}]})
            if path == "many":
                return self.until_close(many_entries())
        if op == "tree" and q.get("format") == ["packed"] and path in PACKED_TREES:
            return self.until_close(PACKED_TREES[path](),
                                    [("content-type", "application/x-sbxfs-tree")])
        if url.path == "/elsewhere":
            # Where a redirect points: a service on the developer's machine, say.
            body = b"LOCAL\n"
            self.send_response(200)
            self.send_header("x-sbxfs-version", FILES["redirected"]["version"])
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if op == "read":
            if path == "redirected":
                self.send_response(302)
                self.send_header("location", "/elsewhere")
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if path == "endless":
                # 1.5 GB answering a read of at most 128 KiB.
                block = b"x" * CHUNK
                return self.until_close((block for _ in range(1536)),
                                        [("x-sbxfs-version", FILES[path]["version"])])
            if path in ("huge_size", "fine.txt", "flapping"):
                body = b"hello\n"
                # "flapping": every read is of a version its stat never shows.
                READS[0] += 1
                version = FILES[path]["version"] if path != "flapping" else "r%d" % READS[0]
                self.send_response(200)
                self.send_header("x-sbxfs-version", version)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        return self.json({"error": "ENOENT", "message": path}, 404)


    def do_POST(self):
        url = urlparse(self.path)
        op = url.path.removeprefix("/v1/")
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if op == "grep":
            # Printed output naming a laptop file: as the file's own path, or as a line more.
            if body.get("pattern") == "forgedpath":
                printed = {"printed": "/etc/passwd\n", "matches": 1, "path": "/etc/passwd"}
            else:
                printed = {"printed": "fine.txt\n/etc/passwd\n", "matches": 1,
                           "path": "fine.txt"}
            summary = {"summary": {"matches": 1, "files_searched": 1, "files_matched": 1,
                                   "bytes": 0, "truncated": False, "errors": []},
                       "truncated": False}
            lines = b"".join(json.dumps(v).encode() + b"\n" for v in (printed, summary))
            self.send_response(200)
            self.send_header("content-type", "application/x-ndjson")
            self.send_header("content-length", str(len(lines)))
            self.end_headers()
            self.wfile.write(lines)
            return
        if op == "glob":
            return self.json({"paths": ["fine.txt", "../../etc/passwd"]})
        if op == "fuzzy":
            return self.json({"matches": [{"path": "/etc/shadow", "score": 9, "positions": []}]})
        return self.json({"error": "ENOENT", "message": op}, 404)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def record(payload):
    return varint(len(payload)) + payload


def entry(name, kind, ino):
    """A packed entry (src/remote/treepack.rs): name, kind, numbers, no target, a version."""
    nums = [6, 0o644, 0, 0, 0, 0, 0, 1, ino, 1, 0]
    version = b"v%d" % ino
    return record(b"F" + varint(len(name)) + name + bytes([kind])
                  + b"".join(varint(n) for n in nums) + varint(0)
                  + varint(len(version) + 1) + version)


def deflated(chunks):
    z = zlib.compressobj(6, zlib.DEFLATED, -15)
    for c in chunks:
        yield z.compress(c)
    yield z.flush()


def bad_name_tree():
    """A subtree whose listing holds a name with a `/` in it."""
    return deflated([record(b"L" + varint(2)), entry(b"a/b", 0, 20), entry(b"c", 0, 21),
                     record(b"E" + varint(0))])


def big_tree():
    """A listing claiming a trillion entries, then endless entries."""
    def gen():
        yield record(b"L" + varint(1 << 40))
        for i in range(10_000_000):
            yield entry(b"f%09d" % i, 0, 100 + i)
    return deflated(gen())


def bomb_tree():
    """A gigabyte of zeros compressed: a deflate bomb."""
    block = bytes(1 << 20)
    return deflated(block for _ in range(1024))


PACKED_TREES = {"badtree": bad_name_tree, "bigtree": big_tree, "bombtree": bomb_tree}


def many_entries():
    """Two million entries, more than any listing may have, streamed."""
    yield b'{"entries": ['
    a = json.dumps(FILES["fine.txt"]).encode()
    batch = []
    for i in range(2_000_000):
        sep = b"," if i else b""
        batch.append(sep + b'{"name":"f%d","attr":' % i + a + b"}")
        if len(batch) == 10_000:
            yield b"".join(batch)
            batch = []
    yield b"".join(batch) + b"]}"


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
