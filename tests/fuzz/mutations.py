"""Byte mutations for fuzzing, in two forms over one set of operations: a
deterministic ``mutate(data, rng)`` for loops that run millions of cases (the
case is a function of its seed, so a crash names its input), and a hypothesis
strategy ``mutated(data)`` whose failures shrink to a small edit.

The operations are the usual fuzzer ones (bit flips, byte and integer
"interesting values", inserts, deletes, truncation, extension, duplication),
plus Kafka-shaped ones: big int16/int32 lengths and unsigned varints, the
lengths of legacy and compact (flexible) strings, bytes and arrays.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import strategies as st

INTERESTING = (
    b"\x00",
    b"\x01",
    b"\x7f",
    b"\x80",
    b"\xff",
    b"\x00\x00",
    b"\xff\xff",
    b"\x7f\xff",
    b"\x80\x00",  # int16: 0, -1, max, min
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\x00\x01\x00\x00",
    b"\x80\x01",
    b"\xff\x7f",
    b"\xff\xff\x03",  # unsigned varints 128, 16383, 65535
    b"\xff\xff\xff\x7f",
    b"\x80\x80\x80\x80\x01",  # 2**28 - 1, 2**28
    b"\xff\xff\xff\xff\x07",
    b"\xff\xff\xff\xff\x0f",  # 2**31 - 1, 2**32 - 1 (a compact length of 4 billion)
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint longer than any Kafka uses
)

Edit = tuple[int, int, int, bytes]  # (operation, position, size, bytes)


def apply(data: bytes, edits: list[Edit]) -> bytes:
    """Apply ``edits`` in order; positions wrap around the current length."""
    out = bytearray(data)
    for op, position, size, payload in edits:
        at = position % (len(out) + 1)
        if op == 0 and out:  # flip one bit
            out[at % len(out)] ^= 1 << (size % 8)
        elif op == 1:  # overwrite with an interesting value
            value = INTERESTING[size % len(INTERESTING)]
            out[at : at + len(value)] = value
        elif op == 2:  # insert bytes
            out[at:at] = payload
        elif op == 3:  # delete a span
            del out[at : at + size % 64 + 1]
        elif op == 4:  # truncate
            del out[at:]
        elif op == 5:  # extend with bytes
            out += payload
        elif op == 6 and out:  # duplicate a span in place
            out[at:at] = out[at : at + size % 32 + 1]
        elif op == 7:  # overwrite with bytes
            out[at : at + len(payload)] = payload
    return bytes(out)


def random_edit(rng: random.Random) -> Edit:
    op = rng.choice((0, 1, 1, 1, 2, 3, 4, 5, 6, 7))  # interesting values most often
    payload = rng.randbytes(rng.choice((1, 1, 2, 4, 8, 33)))
    return op, rng.randrange(1 << 16), rng.randrange(1 << 16), payload


def mutate(data: bytes, rng: random.Random, max_edits: int = 4) -> bytes:
    return apply(data, [random_edit(rng) for _ in range(rng.randint(1, max_edits))])


_edit = st.tuples(
    st.integers(0, 7), st.integers(0, 1 << 16), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=33)
)


def mutated(data: bytes, max_edits: int = 4) -> st.SearchStrategy[bytes]:
    return st.lists(_edit, min_size=1, max_size=max_edits).map(lambda edits: apply(data, edits))


def reframed(mutate_body: Callable[[bytes], bytes], frame: bytes) -> bytes:
    """Mutate a frame's body and give it the length prefix it now needs (the proxy
    only ever hands a decoder a frame read to exactly its prefix's length)."""
    body = mutate_body(frame[4:])
    return len(body).to_bytes(4, "big") + body
