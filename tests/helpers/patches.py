"""Patches changed the way the race and cluster tests need them."""
from __future__ import annotations




def with_notes(patch: bytes, k: int) -> bytes:
    """The patch with k comment lines added at the end of its (only) hunk."""
    lines = patch.decode().splitlines(keepends=True)
    out = []
    for ln in lines:
        if ln.startswith("@@"):
            head, _, rest = ln[3:].partition(" @@")
            old, new = head.split(" ")
            start, _, count = new[1:].partition(",")
            ln = f"@@ {old} +{start},{int(count) + k} @@{rest}"
        out.append(ln)
    out += [f"+# note {i}\n" for i in range(k)]
    return "".join(out).encode()
