"""Independent reference for scan: the rules read straight off the spec, whole file in memory.

usage: scan_ref.py FILE START END MAX_BYTES   (END may be empty) -> one JSON object
"""
import json
import os
import sys


def scan(data, start, end, max_bytes):
    text = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # a trailing newline ends the last line; it does not start one
    total = len(lines)
    last = total if end is None else min(end, total)
    window, used = [], 0
    for line in lines[start - 1:last]:
        cost = len(line) + (1 if window else 0)
        if used + cost > max_bytes:
            break
        used += cost
        window.append(line)
    first = len(lines[start - 1]) if start <= total else 0
    return {
        "lines_hex": [l.hex() for l in window],
        "start_line": start,
        "end_line": start + len(window) - 1,
        "total_lines": total,
        "total_bytes": len(data),
        "first_line_bytes": first,
    }


def main():
    path, start, end, max_bytes = sys.argv[1:5]
    start, end, max_bytes = int(start), (int(end) if end else None), int(max_bytes)
    if start < 1 or (end is not None and end < start):
        print(json.dumps({"error": "invalid_args"}))
        return
    if not os.path.exists(path):
        print(json.dumps({"error": "not_found"}))
        return
    with open(path, "rb") as f:
        print(json.dumps(scan(f.read(), start, end, max_bytes)))


if __name__ == "__main__":
    main()
