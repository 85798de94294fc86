"""Which protobuf family (TF, Torch, Blade) a well-formed predict body is, from its fields.

The three formats share field numbers, so the guess reads what each field holds: Torch
repeats field 1 (inputs) and may carry debug_level (100); a TF input is a map entry
{key, value}; a Blade input carries the required batchsize (field 3).
"""

from __future__ import annotations

from typing import Any

from .wire import Field, scan_fields


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
    return classify(body, scan_fields(body))


def classify(body: Any, fields: list[Field] | None) -> str | None:
    """:func:`sniff` given the body's top-level fields (:func:`scan_fields`), so that a
    decoder can reuse the scan."""
    if fields is None:
        return None
    # One pass over the fields; the checks below keep sniff's order of precedence.
    f1: list[Field] = []
    f2: list[Field] = []
    for f in fields:
        num = f[0]
        if num == 1:
            f1.append(f)
        elif num == 2:
            if f[1] == 0:
                return "torch"  # an unpacked output_filter
            f2.append(f)
        elif num == 100:
            return "torch"  # debug_level
    for f in f1:
        if f[1] != 2:
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
        if not sub:
            continue
        tf_entry = not torchish
        for f, w, _, _ in sub:
            if f == 3 and w == 0:
                return "blade"  # Array.batchsize is required and always sent
            if w != 2 or (f != 1 and f != 2):
                tf_entry = False
        if tf_entry:
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
