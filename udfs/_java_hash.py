"""Java's ``String.hashCode`` of keys read as UTF-8 text, vectorized with numpy.

Java hashes a string's UTF-16 code units: ``h = 31 * h + c`` in int
arithmetic, so ``h = sum(c[j] * 31**(L - 1 - j)) mod 2**32`` for a string of
``L`` units. Written that way every term is independent. 31 is odd, so it
has an inverse modulo 2**32 and a term can be weighted by position alone:
with ``e`` the unit index where a character ends and ``E`` where its key
ends, both counted over the whole batch, ``31**(E - e) = 31**E * 31**-e``.
So each key's hash is ``31**E`` times a difference of one running sum of
``c * 31**-e`` over all characters (uint32 arithmetic wraps like Java's
int). The UTF-8 bytes are decoded to code points in bulk; an astral
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
_INVERSE_31 = np.uint32(pow(31, -1, 2**32))
# Power tables up to this many units are kept between calls (8 bytes a unit).
_CACHED_POWERS = 1 << 20
_powers_cache: tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]] = (
    np.ones(1, dtype=np.uint32),
    np.ones(1, dtype=np.uint32),
)


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
    # Slices of keys keep the per-character temporaries small enough to stay in cache.
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
        powers, inverses = _powers(len(text))
        terms = text.astype(np.uint32)
        terms *= inverses[1 : len(text) + 1]
        return _polynomial(terms, byte_offsets, powers[byte_offsets[1:]])

    # Continuation bytes (10xxxxxx) extend the code point their lead byte starts.
    is_lead = (text & 0xC0) != 0x80
    leads = np.flatnonzero(is_lead)
    code = text[leads].astype(np.uint32)
    multi = np.flatnonzero(code >= 0xC0)
    # Null keys' bytes are not validated and may end mid-sequence.
    padded = np.concatenate([text, np.zeros(3, dtype=np.uint8)])
    code[multi] = _decode_multibyte(padded, leads[multi], code[multi])

    # Key k's characters are the leads at or after its first byte.
    char_offsets = np.searchsorted(leads, byte_offsets)
    # unit_ends[i]: UTF-16 units in characters 0..i-1; astral ones count twice.
    unit_ends = np.arange(len(code) + 1, dtype=np.int64)
    astral = np.flatnonzero(code >= 0x10000)
    if astral.size:
        supplement = code[astral] - np.uint32(0x10000)
        high = np.uint32(0xD800) + (supplement >> np.uint32(10))
        low = np.uint32(0xDC00) + (supplement & np.uint32(0x3FF))
        code[astral] = high * np.uint32(31) + low
        extra = np.zeros(len(code) + 1, dtype=np.int64)
        extra[astral + 1] = 1
        unit_ends += np.cumsum(extra)
    powers, inverses = _powers(int(unit_ends[-1]))
    code *= inverses[unit_ends[1:]]
    return _polynomial(code, char_offsets, powers[unit_ends[char_offsets[1:]]])


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
    terms: npt.NDArray[np.uint32],
    char_offsets: npt.NDArray[np.int64],
    key_end_powers: npt.NDArray[np.uint32],
) -> npt.NDArray[np.uint32]:
    """Per key: ``31**E`` (given) times the sum of its characters' ``c * 31**-e`` terms."""
    running = np.zeros(len(terms) + 1, dtype=np.uint32)
    np.cumsum(terms, dtype=np.uint32, out=running[1:])
    sums = running[char_offsets[1:]] - running[char_offsets[:-1]]
    hashes: npt.NDArray[np.uint32] = sums * key_end_powers
    return hashes


def _powers(units: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """``31**j`` and ``31**-j`` modulo 2**32 for ``j`` in ``0..units``."""
    global _powers_cache
    cached = _powers_cache
    if len(cached[0]) > units:
        return cached
    if units >= _CACHED_POWERS:
        return _power_table(np.uint32(31), units + 1), _power_table(_INVERSE_31, units + 1)
    # Doubling keeps regrowth rare; replacing the tuple whole keeps readers consistent.
    size = min(max(units + 1, 2 * len(cached[0])), _CACHED_POWERS)
    _powers_cache = (_power_table(np.uint32(31), size), _power_table(_INVERSE_31, size))
    return _powers_cache


def _power_table(base: np.uint32, size: int) -> npt.NDArray[np.uint32]:
    table = np.empty(size, dtype=np.uint32)
    table[0] = 1
    # uint32 products wrap modulo 2**32, as Java's int multiplication does.
    np.cumprod(np.full(size - 1, base, dtype=np.uint32), dtype=np.uint32, out=table[1:])
    return table


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
