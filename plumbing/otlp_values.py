"""OTLP attribute values: a Python value into an OTLP `AnyValue` protobuf, as the SDK's encoder
writes it. Used by instrument's exporters (instrument.otlp_export, instrument.step_spans, the
plugin's counts), simulate's span writer, and tests and benches that build payloads by hand."""

from __future__ import annotations

import logging

__all__ = ["fill_attributes", "set_any_value"]

log = logging.getLogger("tailtrace.otlp")


def set_any_value(v, value) -> None:
    """Fill an OTLP `AnyValue` protobuf message `v` from a Python value: bool, int, float, str,
    bytes, list or tuple (array_value) or dict (kvlist_value), recursively; None gives an empty
    (but present) value. Used by instrument.otlp_export (whose fill_attributes serves
    instrument.step_spans too) and to build test and benchmark payloads by hand. Raises TypeError for any other type and ValueError for an int outside
    int64 (protobuf's own check)."""
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, str):
        v.string_value = value
    elif isinstance(value, bytes):
        v.bytes_value = value
    elif isinstance(value, (list, tuple)):  # the SDK keeps sequence attributes as tuples
        v.array_value.SetInParent()
        for x in value:
            set_any_value(v.array_value.values.add(), x)
    elif isinstance(value, dict):
        v.kvlist_value.SetInParent()
        for k, x in value.items():
            kv = v.kvlist_value.values.add()
            kv.key = k
            set_any_value(kv.value, x)
    elif value is None:  # the empty AnyValue, present, as the SDK encodes it
        v.SetInParent()
    else:
        raise TypeError(f"an OTLP AnyValue cannot hold a {type(value).__name__}")


def fill_attributes(repeated, attributes) -> None:
    """Append `attributes` (a mapping, or None) to a repeated OTLP `KeyValue` field, as the SDK's
    encoder does: a value protobuf cannot hold leaves that attribute out (logged at debug level)."""
    if not attributes:
        return
    for k, val in attributes.items():
        kv = repeated.add()
        try:
            kv.key = k
            set_any_value(kv.value, val)
        except (TypeError, ValueError, OverflowError):  # as the SDK: the attribute is left out
            log.debug("attribute %r not encodable", k, exc_info=True)
            del repeated[-1]
