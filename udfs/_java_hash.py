"""Java's ``String.hashCode`` of keys read as UTF-8 text, vectorized with numpy.

Java hashes a string's UTF-16 code units: ``h = 31 * h + c`` in int
arithmetic, so ``h = sum(c[j] * 31**(L - 1 - j)) mod 2**32`` for a string of
``L`` units. Written that way every term is independent: the UTF-8 bytes are
decoded to code points in bulk, each code point is weighted by the power of
31 for the units that follow it in its key, and a running sum (uint32,
wrapping like Java's int) is differenced at key boundaries. An astral
character is two units, the surrogates ``hi, lo``, weighing ``hi * 31 + lo``.

Runs on the driver (:func:`java_hash_codes`) and on executors, once per
Arrow batch, inside :func:`udfs.java_hash_code`.
"""

from __future__ import annotations

import codecs

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from udfs._arrow import KeyBuffers, Keys, key_array, key_buffers, reject_nulls

__all__ = ["java_hash_buffers", "java_hash_codes", "utf8_keys"]

# Payload bits of a UTF-8 lead byte, by the sequence's length in bytes.
_LEAD_PAYLOAD = np.array([0, 0x7F, 0x1F, 0x0F, 0x07], dtype=np.uint32)
_JAVA_REPLACE = "udfs.java-utf8-replace"
_KEYS_PER_SLICE = 16384


def java_hash_codes(keys: Keys) -> npt.NDArray[np.int32]:
    """Java ``String.hashCode`` of each key read as UTF-8 text.

    Matches ``new String(key, StandardCharsets.UTF_8).hashCode()`` for bytes
    keys and ``key.hashCode()`` for str keys (as a JVM holding the same text
    would compute it: UTF-16 code units, astral characters as surrogate pairs).

    Parameters
    ----------
    keys
        A sequence, numpy object array, pandas Series or pyarrow array of
        ``bytes`` or ``str``.

    Returns
    -------
    numpy.ndarray
        ``int32``, one hash per key; the empty key hashes to 0.

    Raises
    ------
    ArgumentTypeError
        ``keys`` is not a container of bytes/str.
    ArgumentError
        A key is null (Java has no hash for it; the Spark column UDF returns
        null instead).

    Notes
    -----
    Bytes that are not valid UTF-8 are decoded as Java decodes them, each
    malformed sequence becoming U+FFFD. Such input takes a slow path that
    decodes every key of the call in Python; valid input never does.
    """
    array = utf8_keys(key_array(keys))
    reject_nulls(array)
    return java_hash_buffers(key_buffers(array)).view(np.int32)


def utf8_keys(array: pa.Array) -> pa.Array:
    """``array`` (binary or string) as a string array of valid UTF-8, decoded as Java would."""
    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    text = array.view(pa.large_string() if large else pa.string())
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        # Rare by construction (Spark and Python strings are valid UTF-8), so
        # simplicity wins over speed here.
        raw = array.view(pa.large_binary() if large else pa.binary()).to_pylist()
        return pa.array(
            [None if key is None else key.decode("utf-8", _JAVA_REPLACE) for key in raw],
            type=text.type,
        )
    return text


def java_hash_buffers(keys: KeyBuffers) -> npt.NDArray[np.uint32]:
    """Java ``String.hashCode`` of every key in ``keys``, which must be valid UTF-8, as uint32."""
    hashes = np.empty(len(keys), dtype=np.uint32)
    # Slices of keys keep the dozen per-character temporaries in cache
    # (about 3x faster on 1M keys than whole-array passes).
    for lo in range(0, len(keys), _KEYS_PER_SLICE):
        hi = min(lo + _KEYS_PER_SLICE, len(keys))
        hashes[lo:hi] = _hash_slice(keys.data, keys.offsets[lo : hi + 1])
    return hashes


def _hash_slice(
    data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint32]:
    first = int(offsets[0])
    text = data[first : int(offsets[-1])]
    byte_offsets = offsets - first
    if text.size == 0 or int(text.max()) < 0x80:
        # ASCII: one byte is one code point is one UTF-16 unit.
        return _polynomial(text.astype(np.uint32), byte_offsets, byte_offsets)

    # Continuation bytes (10xxxxxx) extend the code point their lead byte starts.
    is_lead = (text & 0xC0) != 0x80
    leads = np.flatnonzero(is_lead)
    code = text[leads].astype(np.uint32)
    multi = np.flatnonzero(code >= 0xC0)
    # Null keys' bytes are not validated and may end mid-sequence.
    padded = np.concatenate([text, np.zeros(3, dtype=np.uint8)])
    code[multi] = _decode_multibyte(padded, leads[multi], code[multi])

    astral = code >= 0x10000
    if astral.any():
        supplement = code[astral] - np.uint32(0x10000)
        high = np.uint32(0xD800) + (supplement >> np.uint32(10))
        low = np.uint32(0xDC00) + (supplement & np.uint32(0x3FF))
        code[astral] = high * np.uint32(31) + low

    lead_count = np.zeros(len(text) + 1, dtype=np.int64)
    np.cumsum(is_lead, out=lead_count[1:])
    char_offsets = lead_count[byte_offsets]
    units_before = np.zeros(len(code) + 1, dtype=np.int64)
    np.cumsum(1 + astral, out=units_before[1:])
    return _polynomial(code, char_offsets, units_before[char_offsets], units_before)


def _decode_multibyte(
    text: npt.NDArray[np.uint8], starts: npt.NDArray[np.intp], lead: npt.NDArray[np.uint32]
) -> npt.NDArray[np.uint32]:
    """The code points of the 2- to 4-byte sequences starting at ``starts``."""
    size = 2 + (lead >= 0xE0).astype(np.uint8) + (lead >= 0xF0)
    code = lead & _LEAD_PAYLOAD[size]
    for follower in (1, 2, 3):
        more = np.flatnonzero(size > follower)
        payload = text[starts[more] + follower].astype(np.uint32) & np.uint32(0x3F)
        code[more] = (code[more] << np.uint32(6)) | payload
    return code


def _polynomial(
    weight: npt.NDArray[np.uint32],
    char_offsets: npt.NDArray[np.int64],
    unit_offsets: npt.NDArray[np.int64],
    units_before: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.uint32]:
    """``sum(weight[i] * 31**units_after[i]) mod 2**32`` per key.

    Key ``k`` owns characters ``char_offsets[k]:char_offsets[k + 1]`` and
    UTF-16 units ``unit_offsets[k]:unit_offsets[k + 1]``; ``units_before[i]``
    is the global unit index where character ``i`` starts (the character
    index itself when every character is one unit).
    """
    chars_per_key = np.diff(char_offsets)
    unit_end_of_key = np.repeat(unit_offsets[1:], chars_per_key)
    unit_end_of_char = (
        np.arange(1, len(weight) + 1, dtype=np.int64) if units_before is None else units_before[1:]
    )
    units_after = unit_end_of_key - unit_end_of_char
    longest = int(np.diff(unit_offsets).max()) if len(chars_per_key) else 0
    powers = np.ones(max(longest, 1), dtype=np.uint32)
    if longest > 1:
        # uint32 products wrap modulo 2**32, as Java's int multiplication does.
        np.cumprod(np.full(longest - 1, 31, dtype=np.uint32), dtype=np.uint32, out=powers[1:])
    terms = weight * powers[units_after]
    running = np.zeros(len(terms) + 1, dtype=np.uint32)
    np.cumsum(terms, dtype=np.uint32, out=running[1:])
    hashes: npt.NDArray[np.uint32] = running[char_offsets[1:]] - running[char_offsets[:-1]]
    return hashes


def _java_utf8_replace(error: UnicodeError) -> tuple[str, int]:
    """Replace a malformed UTF-8 sequence with U+FFFD, sized the way Java does.

    Python's ``"replace"`` agrees with Java's decoder everywhere except
    UTF-8-encoded surrogates (``ED A0..BF ..``): Java swallows the whole
    3-byte sequence (or the truncated tail) as one malformed input, Python
    replaces each byte.
    """
    if not isinstance(error, UnicodeDecodeError):
        raise error
    data, start = error.object, error.start
    if data[start] == 0xED and start + 1 < len(data) and 0xA0 <= data[start + 1] <= 0xBF:
        if start + 2 >= len(data):
            return "\ufffd", len(data)
        if data[start + 2] & 0xC0 == 0x80:
            return "\ufffd", start + 3
        return "\ufffd", start + 2
    return "\ufffd", error.end


codecs.register_error(_JAVA_REPLACE, _java_utf8_replace)
