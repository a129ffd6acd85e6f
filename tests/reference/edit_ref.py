"""Independent reference for edit: the rules applied to bytes in memory, no file writes.

usage: edit_ref.py  < {"content_hex": ..., "old": ..., "new": ..., "replace_all": bool}
prints {"count": n, "content": ...} or {"error": token[, "count": n]}
"""
import json
import re
import sys

req = json.load(sys.stdin)
try:
    text = bytes.fromhex(req["content_hex"]).decode("utf-8")
except UnicodeDecodeError:
    print(json.dumps({"error": "read_failed"}))
    sys.exit(0)
nl = lambda s: re.sub(r"\r\n?", "\n", s)  # noqa: E731
text, old, new = nl(text), nl(req["old"]), nl(req["new"])
if not old:
    out = {"error": "invalid_args"}
else:
    # Non-overlapping occurrences, left to right, found by scanning rather than str.count.
    starts, i = [], text.find(old)
    while i >= 0:
        starts.append(i)
        i = text.find(old, i + len(old))
    if not starts:
        out = {"error": "string_not_found"}
    elif len(starts) > 1 and not req["replace_all"]:
        out = {"error": "multiple_occurrences", "count": len(starts)}
    else:
        use = starts if req["replace_all"] else starts[:1]
        pieces, at = [], 0
        for s in use:
            pieces += [text[at:s], new]
            at = s + len(old)
        pieces.append(text[at:])
        out = {"count": len(use), "content": "".join(pieces)}
print(json.dumps(out))
