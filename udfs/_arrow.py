"""Turn the key containers the public functions accept into Arrow binary buffers.

Runs wherever the caller runs: on the driver for the numpy functions, on an
executor's Python worker (once per Arrow batch) inside the Arrow UDFs. Only
numpy and pyarrow are imported here; a pandas Series is recognised without
importing pandas.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from udfs._errors import invalid, type_error, wrong_type

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["KeyBuffers", "Keys", "key_array", "key_buffers", "null_mask", "reject_nulls"]

Keys: TypeAlias = (
    "Sequence[bytes | str] | npt.NDArray[Any] | pd.Series[Any] | pa.Array | pa.ChunkedArray"
)
"""What the numpy functions accept as keys: bytes, or str hashed as its UTF-8 bytes."""

_EXPECTED = "keys as a sequence, numpy array, pandas Series or pyarrow array of bytes or str"


class KeyBuffers:
    """The keys' bytes as numpy views of one Arrow binary array's buffers.

    Key ``i`` is ``data[offsets[i]:offsets[i + 1]]``. Offsets are absolute
    positions in ``data`` (an Arrow slice offset is already applied), so
    ``data`` may hold bytes before the first key and after the last.
    """

    __slots__ = ("data", "offsets")

    def __init__(self, offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8]) -> None:
        self.offsets = offsets
        self.data = data

    def __len__(self) -> int:
        return len(self.offsets) - 1


def key_array(keys: Keys, name: str = "keys") -> pa.Array:
    """The keys as one Arrow array of type binary, large_binary, string or large_string.

    Zero-copy for Arrow binary and string arrays; other containers go through
    ``pyarrow.array``, which converts in C++ (a list mixing bytes and str
    becomes binary, str elements as their UTF-8 bytes).

    Raises
    ------
    ArgumentTypeError
        ``keys`` is a single bytes/str value, or its elements are not bytes/str.
    """
    if isinstance(keys, str | bytes | bytearray | memoryview):
        raise wrong_type(name, _EXPECTED + " (not a single key)", keys)
    if isinstance(keys, pa.ChunkedArray):
        # One chunk keeps the kernels to a single pass; chunked input is rare
        # (UDF batches and pa.array results are single arrays).
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        try:
            keys = pa.array(keys, from_pandas=_is_pandas(keys))
        except UnicodeEncodeError as error:
            raise invalid(
                name, "str keys that encode to UTF-8 (no lone surrogates)", error.object
            ) from error
        except (pa.ArrowException, TypeError, ValueError) as error:
            raise type_error(name, _EXPECTED, f"an element that is neither ({error})") from error
    return _normalized(keys, name)


def key_buffers(array: pa.Array) -> KeyBuffers:
    """Numpy views (no copy) of a binary/string array's offsets and data buffers."""
    large = pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type)
    offset_type = np.dtype(np.int64 if large else np.int32)
    buffers = array.buffers()
    offsets = np.frombuffer(
        buffers[1],
        dtype=offset_type,
        count=len(array) + 1,
        offset=array.offset * offset_type.itemsize,
    )
    data_buffer = buffers[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    return KeyBuffers(offsets.astype(np.int64, copy=False), data)


def null_mask(array: pa.Array) -> npt.NDArray[np.bool_] | None:
    """True where a key is null, or None when no key is."""
    if array.null_count == 0:
        return None
    mask: npt.NDArray[np.bool_] = array.is_null().to_numpy(zero_copy_only=False)
    return mask


def reject_nulls(array: pa.Array, name: str = "keys") -> None:
    """Refuse null keys: there is no hash to give them.

    Raises
    ------
    ArgumentError
        Naming how many keys are null and the first one's index.
    """
    mask = null_mask(array)
    if mask is not None:
        first = int(np.argmax(mask))
        raise invalid(
            f"{name}[{first}]",
            "a bytes or str key (null keys have no hash: Kafka's producer gives them a "
            f"sticky partition instead; {array.null_count} of {len(array)} keys are null)",
            None,
        )


def _normalized(array: pa.Array, name: str) -> pa.Array:
    kind = array.type
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
    ):
        return array
    if pa.types.is_dictionary(kind):
        return _normalized(array.dictionary_decode(), name)
    if pa.types.is_null(kind):
        return pa.nulls(len(array), type=pa.binary())
    if (
        pa.types.is_binary_view(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        return array.cast(pa.large_string() if pa.types.is_string_view(kind) else pa.large_binary())
    raise type_error(name, _EXPECTED, f"an array of {kind}")


def _is_pandas(keys: object) -> bool:
    # A pandas object can only exist if pandas was imported already; asking
    # sys.modules keeps `import udfs` from importing pandas itself.
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(keys, pandas.Series | pandas.Index)
