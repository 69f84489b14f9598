"""Node name -> snapshot row for a whole NodeNames array at once, read from the request's bytes.

A dict lookup per name costs more than it seems on the hot path: orjson makes a fresh str per
name, each is hashed, and each probe reads a key object somewhere in the heap (about 1 ms for
5,000 names in a busy server). Here the names are cut out of the raw array as 8-byte words
hashed by numpy, looked up in small open tables and verified word for word against the
known names; only contiguous arrays are touched. Built once per node list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["NameTable", "RawNames", "find_raw_names", "ends_with_member", "MAX_WIDTH", "Rows"]

MAX_WIDTH = 128
"""Longest name (UTF-8 bytes) the table handles; longer node lists use the dict lookup."""

_MAX_LEVELS = 8
_AMBIGUOUS = -2
_MULT = np.array(
    [
        0x9E3779B97F4A7C15,
        0xBF58476D1CE4E5B9,
        0x94D049BB133111EB,
        0xD6E8FEB86659FD93,
        0xA0761D6478BD642F,
        0xE7037ED1A0B428DB,
        0x8EBC6AF09C88C6E3,
        0x589965CC75374CC3,
    ],
    dtype=np.uint64,
)

Rows = npt.NDArray[np.intp]
Words = list[npt.NDArray[np.uint64]]

_LE = np.dtype("<u8")  # names are read 8 bytes at a time, first byte lowest, on any machine
_BYTE_MASKS = np.array([(1 << (8 * j)) - 1 for j in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
"""_BYTE_MASKS[j] keeps the first j bytes of a little-endian word."""


def _hash(words: Words, level: int) -> npt.NDArray[np.uint64]:
    """64-bit hash of each name from its 8-byte words; a different function per level."""
    h = np.full(len(words[0]), _MULT[level], np.uint64)
    with np.errstate(over="ignore"):
        for c, col in enumerate(words):
            h ^= col
            h *= _MULT[(level + c + 1) % len(_MULT)]
            h ^= h >> np.uint64(31)
    return h


_KEY = b'"NodeNames":['
_JSON_SPACE = b" \t\r\n"  # the only whitespace JSON allows (bytes.strip would also take \v and \f)


def _doc_end(raw: bytes) -> int:
    """Index just past the last byte of `raw` that is not JSON whitespace (no copy unless there is some)."""
    return len(raw.rstrip(_JSON_SPACE))


def ends_with_member(raw: bytes, member: bytes) -> bool:
    """Whether `raw`, a JSON object the caller has decoded, ends with `member` (`"key":value`, compact)
    as its last top-level member: `...,member}`, nothing but JSON whitespace after.

    Sound for valid JSON: the final `}` closes the top-level object, so the member's value ends at
    that level; the member's first quote, not escaped, must open a string (a closing quote there
    would leave the key's letters outside any string), so the key is a key of that object and no
    string swallows it. As Go's decoder lets the last of duplicate keys win, this member is what a
    full parse reads for its key."""
    end = _doc_end(raw) - 1
    at = end - len(member)
    return at > 0 and raw[end] == 0x7D and raw.startswith(member, at) and raw[at - 1] != 0x5C


@dataclass(frozen=True, slots=True, eq=False)
class RawNames:
    """The inside of a request's NodeNames array, raw[start:end], and its quote offsets in it."""

    start: int
    end: int
    quotes: npt.NDArray[np.intp]


def find_raw_names(raw: bytes, count: int | None = None) -> RawNames | None:
    """The top-level NodeNames array of `raw` when it is what Go writes for `count` plain names:
    the body's last member, compact, no escapes (`"a","b",...`). That slice is then byte for byte
    the names' JSON encodings joined by commas, so a reply may echo it. None for any other shape
    (the caller then works from the decoded names). count None: as many as the array holds.

    Only valid JSON may be trusted to this scan (the caller decodes the rest of the body, or all
    of it): then the array found is the top-level object's last member, the one a full parse
    reads as NodeNames (Go's decoder, like ours, lets the last of duplicate keys win)."""
    if count is not None and count < 1:
        return None
    at = raw.find(_KEY)  # Go writes Pod, Nodes, NodeNames: found just past the pod
    if at <= 0 or raw[at - 1] == 0x5C:
        return None
    start = at + len(_KEY)
    close = _doc_end(raw) - 1  # the document's closing `}`
    end = close - 1
    # `]` then `}` closes the document, so the array is the top-level object's last member; with
    # no backslash, exactly 2*count quotes each pair joined by one comma leave room for nothing
    # but count plain strings (a key found inside the pod would bring more quotes along).
    if (
        end <= start
        or raw[close] != 0x7D
        or raw[end] != 0x5D
        or raw[start] != 0x22
        or raw[end - 1] != 0x22
        or raw.find(b"\\", start, end) >= 0
    ):
        return None
    seg = np.frombuffer(raw, np.uint8, end - start, start)
    quotes = np.flatnonzero(seg == 0x22)
    if count is None:
        count = len(quotes) // 2
    if len(quotes) != 2 * count or seg.min() < 0x20:  # a raw control character is not JSON
        return None
    if seg.max() >= 0x80:  # non-ASCII names: the slice must be valid UTF-8, as the decoder demands
        try:
            raw[start:end].decode()
        except UnicodeDecodeError:
            return None
    closes = quotes[1:-1:2]
    if count > 1 and not ((quotes[2::2] - closes == 2).all() and (seg[closes + 1] == 0x2C).all()):
        return None
    return RawNames(start, end, quotes)


class NameTable:
    """Exact lookup of names given as the inside of a JSON array of plain strings."""

    def __init__(self, names: Sequence[str]) -> None:
        enc = [n.encode() for n in names]
        longest = max((len(e) for e in enc), default=0)
        self.width = max(8, -(-longest // 8) * 8)
        self.usable = longest <= MAX_WIDTH and len(enc) > 0
        self.levels: list[tuple[int, npt.NDArray[np.int32]]] = []
        self.words: Words = []
        self.masks: Words = []
        if not self.usable:
            return
        w = self.width
        # masks[c][n]: the bytes of word c that belong to a name of n bytes
        self.masks = [_BYTE_MASKS[np.clip(np.arange(w + 1) - 8 * c, 0, 8)] for c in range(w // 8)]
        mat = np.frombuffer(b"".join(e.ljust(w, b"\0") for e in enc), _LE).reshape(len(enc), w // 8)
        self.words = [np.ascontiguousarray(mat[:, c], dtype=np.uint64) for c in range(w // 8)]
        # Names that share a slot move on to the next level (another hash, a roomier table); a few
        # levels leave none in practice, and any left over are looked up by the caller.
        remaining = np.arange(len(enc), dtype=np.intp)
        while len(remaining) and len(self.levels) < _MAX_LEVELS:
            room = 8 if not self.levels else 32
            bits = max(4, (room * len(remaining) - 1).bit_length())
            words = [col[remaining] for col in self.words]
            slot = (_hash(words, len(self.levels)) >> np.uint64(64 - bits)).astype(np.intp)
            counts = np.bincount(slot, minlength=1 << bits)
            table = np.full(1 << bits, -1, np.int32)
            table[slot] = remaining
            table[counts > 1] = _AMBIGUOUS
            self.levels.append((bits, table))
            remaining = remaining[counts[slot] > 1]

    def lookup(self, raw: bytes, names: RawNames) -> tuple[Rows, Rows] | None:
        """Row of each name (-1: unknown), and the positions of the names left unresolved here
        (to be looked up by name). None when the table cannot serve this node list."""
        if not self.usable:
            return None
        w = self.width
        count = len(names.quotes) // 2
        seg = np.frombuffer(raw, np.uint8, names.end - names.start, names.start)
        quotes = names.quotes
        starts = quotes[0::2] + 1
        lens = quotes[1::2] - starts
        pad = np.zeros(len(seg) + w + 8, np.uint8)
        pad[: len(seg)] = seg
        # Every byte offset as the start of an (unaligned) 8-byte word: a name's k-th word is one
        # gather, and its bytes past the name's end are masked off.
        at = np.ndarray((len(seg) + w,), _LE, pad.data, 0, (1,))
        short = np.minimum(lens, w)  # longer names are never looked up; keep their indexes in range
        words = [at[starts + 8 * c] & masks[short] for c, masks in enumerate(self.masks)]
        full = words
        cand = np.full(count, -1, np.intp)
        todo = np.flatnonzero(lens <= w)
        if len(todo) < count:
            words = [col[todo] for col in words]
        for level, (bits, table) in enumerate(self.levels):
            hit = table[(_hash(words, level) >> np.uint64(64 - bits)).astype(np.intp)]
            cand[todo] = hit
            amb = hit == _AMBIGUOUS
            if not amb.any():
                todo = todo[:0]
                break
            todo = todo[amb]
            words = [col[amb] for col in words]
        found = np.flatnonzero(cand >= 0)
        rows = np.full(count, -1, np.intp)
        if len(found):
            got = cand[found]
            same = np.ones(len(found), np.bool_)
            for known, asked in zip(self.words, full):
                same &= known[got] == asked[found]
            rows[found[same]] = got[same]
        return rows, todo
