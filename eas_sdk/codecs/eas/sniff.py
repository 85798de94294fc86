"""Which protobuf family (TF, Torch, Blade) a well-formed predict body is, from its fields.

The three formats share field numbers, so the guess reads what each field holds: Torch
repeats field 1 (inputs) and may carry debug_level (100); a TF input is a map entry
{key, value}; a Blade input carries the required batchsize (field 3).
"""

from __future__ import annotations

from typing import Any

from .wire import scan_fields


def _looks_like_array_proto(buf: Any, s: int, e: int) -> bool:
    """Torch/TF ArrayProto: first key is field 1 varint (dtype); empty is a padded input."""
    if s == e:
        return True
    if buf[s] != 0x08:
        return False
    sub = scan_fields(buf, s, e)
    return sub is not None and all(f <= 8 for f, _, _, _ in sub)


def sniff(body: Any) -> str | None:
    """Guess the protobuf family of a body that is well-formed wire format.

    Returns "tf", "torch", "blade", or None when the bytes are not protobuf at all.
    """
    fields = scan_fields(body)
    if fields is None:
        return None
    f1 = [f for f in fields if f[0] == 1]
    f2 = [f for f in fields if f[0] == 2]
    if any(f[0] == 100 for f in fields) or any(f[1] == 0 for f in f2):
        return "torch"  # debug_level, or an unpacked output_filter
    if any(f[1] != 2 for f in f1):
        return None
    if len(f1) > 1:
        return "torch"  # repeated positional inputs; TF/Blade carry one signature string
    torchish = bool(f1) and _looks_like_array_proto(body, f1[0][2], f1[0][3])
    sig_is_text = False
    if f1 and not torchish:
        try:
            body[f1[0][2] : f1[0][3]].decode("utf-8")
            sig_is_text = True
        except UnicodeDecodeError:
            return None
    for _, _wt, s, e in f2:
        sub = scan_fields(body, s, e)
        if sub is None:
            continue
        if any(f == 3 and w == 0 for f, w, _, _ in sub):
            return "blade"  # Array.batchsize is required and always sent
        if not torchish and sub and all(f in (1, 2) and w == 2 for f, w, _, _ in sub):
            return "tf"  # map entry {key, value}
    if torchish and f1 and body[f1[0][2] : f1[0][3]] != b"":
        return "torch"
    if sig_is_text or not fields:
        # Inputs absent or unrecognisable; TF and Blade look alike here.
        if any(f[0] == 3 and _blade_output_info(body, f[2], f[3]) for f in fields):
            return "blade"
        return "tf"
    return "torch"


def _blade_output_info(buf: Any, s: int, e: int) -> bool:
    sub = scan_fields(buf, s, e)
    return bool(sub) and any(f == 3 and w == 0 for f, w, _, _ in sub or ())
