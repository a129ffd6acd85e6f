"""Materialise the file specs of tests/vectors/*.json (the same rules as tests/common/mod.rs)."""
import base64


def file_bytes(spec):
    if "hex" in spec:
        data = bytes.fromhex(spec["hex"])
    elif "line_prefix" in spec:
        width = spec.get("width", 1)
        data = b"".join(
            (spec["line_prefix"] + str(i).zfill(width) + "\n").encode()
            for i in range(1, spec["count"] + 1)
        )
    else:
        data = spec.get("text", "").encode("utf-8")
    data = data * spec.get("repeat", 1)
    if spec.get("no_final_newline") and data.endswith(b"\n"):
        data = data[:-1]
    return data
