"""Hypothesis strategies for any protobuf message, built from its descriptor: every field
with boundary and random values (empty, huge and odd strings; 0, -1, extremes; NaN and
infinities; unknown enum numbers; nested and repeated fields), for fuzzing the RPCs."""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

F = FieldDescriptor
MAX_DEPTH = 3
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)

_texts = st.one_of(
    st.sampled_from(["", " ", "a", "job-1", "-", "../x", "x" * 300, "é\u0000\u202e", "0" * 64]),
    st.text(max_size=40),
)
_floats = st.one_of(
    st.sampled_from([0.0, -1.0, 1e308, -1e308, float("nan"), float("inf"), -float("inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(
        st.sampled_from([0, 1, -1, low, high]), st.integers(min_value=low, max_value=high)
    )


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return _ints(*INT32)
    if kind in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return _ints(*INT64)
    if kind in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return _ints(0, 2**32 - 1)
    if kind in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return _ints(0, 2**64 - 1)
    if kind in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return _floats if kind == F.TYPE_DOUBLE else st.floats(width=32)
    if kind == F.TYPE_BOOL:
        return st.booleans()
    if kind == F.TYPE_STRING:
        return _texts
    if kind == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == F.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.sampled_from([99, -5]))  # unknown ones too
    raise TypeError(f"no strategy for field {field.full_name}")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of this type with a random subset of fields set."""
    cls = GetMessageClass(descriptor)
    fields = [f for f in descriptor.fields if not (f.message_type and depth >= MAX_DEPTH)]

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        message = cls()
        for field in fields:
            if not draw(st.booleans()):
                continue
            if field.message_type is not None:
                if field.message_type.GetOptions().map_entry:
                    continue  # maps: none in our contracts' requests
                inner = messages(field.message_type, depth + 1)
                if _repeated(field):
                    for item in draw(st.lists(inner, max_size=3)):
                        getattr(message, field.name).add().CopyFrom(item)
                else:
                    getattr(message, field.name).CopyFrom(draw(inner))
            elif _repeated(field):
                getattr(message, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
            else:
                setattr(message, field.name, draw(_scalar(field)))
        return message

    return build()


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)
