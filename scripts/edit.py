#!/usr/bin/env python3
"""edit.py PATH_B64 OLD_B64 NEW_B64 REPLACE_ALL_B64 — sbxfs `edit` for sandboxes with python3.

Every parameter arrives base64-encoded (REPLACE_ALL is "1" or "0"), so no shell quoting can touch
it. The only output is one line: __RESULT__{"count": N} or __RESULT__{"error": TOKEN, ...} with
TOKEN one of not_found, string_not_found, multiple_occurrences (with "count"), read_failed,
write_failed, invalid_args. Same rules as src/search/edit.rs, pinned by tests/vectors/edit.json:
old non-empty; CRLF and lone CR normalised to LF in the file, old and new; non-overlapping count;
the file must be UTF-8; atomic write (temp file beside the real target, mode kept, fsync, rename).
"""
import base64
import binascii
import json
import os
import sys
import tempfile

MAX_EDIT_FILE_BYTES = 256 * 1024 * 1024


def result(**fields):
    sys.stdout.write("__RESULT__" + json.dumps(fields) + "\n")
    sys.exit(0)


def normalize(s):
    return s.replace("\r\n", "\n").replace("\r", "\n")


def write_atomic(target, data, st):
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".sbxfs-",
                               suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), st.st_mode & 0o7777)
            try:
                os.fchown(f.fileno(), st.st_uid, st.st_gid)
            except OSError:
                pass  # not root: the file becomes ours, as an editor's save would make it
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def main():
    if len(sys.argv) != 5:
        result(error="invalid_args", message="expected 4 base64 arguments")
    try:
        path = base64.b64decode(sys.argv[1], validate=True)
        old = base64.b64decode(sys.argv[2], validate=True).decode("utf-8")
        new = base64.b64decode(sys.argv[3], validate=True).decode("utf-8")
        flag = base64.b64decode(sys.argv[4], validate=True)
    except (binascii.Error, UnicodeDecodeError):
        result(error="invalid_args", message="arguments must be base64 of UTF-8 text")
    if flag not in (b"0", b"1"):
        result(error="invalid_args", message="replace_all must be 0 or 1")
    if not old:
        result(error="invalid_args", message="the string to replace is empty")
    path = os.fsdecode(path)
    if not os.path.exists(path):
        result(error="not_found")
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
        if not os.path.isfile(target) or st.st_size > MAX_EDIT_FILE_BYTES:
            result(error="read_failed", message="not a regular file, or too large")
        with open(target, "rb") as f:
            content = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        result(error="read_failed", message=str(e))
    content, old, new = normalize(content), normalize(old), normalize(new)
    count = content.count(old)
    if count == 0:
        result(error="string_not_found")
    if count > 1 and flag != b"1":
        result(error="multiple_occurrences", count=count)
    updated = content.replace(old, new) if flag == b"1" else content.replace(old, new, 1)
    try:
        write_atomic(target, updated.encode("utf-8"), st)
    except OSError as e:
        result(error="write_failed", message=str(e))
    result(count=count if flag == b"1" else 1)


if __name__ == "__main__":
    main()
