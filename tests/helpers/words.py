"""The words of cyctx's messages: how many sentences a message has."""

import re

# A sentence ends at ".", "!" or "?" followed by a space and more text, or at the end; a
# period inside a word (a repr's "cyctx.ContextGuard", "libcuda.so.1", "0x7f.") ends none.
_END = re.compile(r"[.!?](?:\s+|$)")


def sentences(text):
    """The sentences of `text`, each stripped."""
    parts, start = [], 0
    for m in _END.finditer(text):
        parts.append(text[start : m.end()].strip())
        start = m.end()
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts
