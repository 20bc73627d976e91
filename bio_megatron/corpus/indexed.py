"""megatron-core's indexed dataset (``<prefix>.bin`` / ``<prefix>.idx``) written with numpy alone.

Why not megatron-core's ``IndexedDatasetBuilder``: importing it pulls in torch and megatron-core
(~10 s of a tokenize run on a small machine) only to write a few arrays. The format is small and
fixed (``megatron/core/datasets/indexed_dataset.py``, ``_IndexWriter``), so we write it here;
``tests/corpus/test_indexed_writer.py`` checks our ``.idx`` is byte-identical to the builder's and that
megatron-core's ``IndexedDataset`` reads it back.

``.idx`` layout (little-endian), for ``S`` sequences and ``D + 1`` document indices::

    b"MMIDIDX\\x00\\x00"        9-byte magic
    uint64 1                    format version
    uint8  dtype code           4 = int32 (see ``DTYPE_CODES``)
    uint64 S                    sequence count
    uint64 D + 1                document-index count (a leading 0, then one end per document)
    int32[S]                    sequence lengths, in tokens
    int64[S]                    sequence pointers: byte offset of each sequence in the ``.bin``
    int64[D + 1]                document indices: sequence index where each document ends

The ``.bin`` is the sequences' tokens, back to back, in ``dtype``. (Multimodal ``sequence_modes``,
appended after the document indices by megatron for multimodal data, are not produced here.)
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron-core's ``DType`` enum: the code stored in the header for each token dtype.
DTYPE_CODES: dict[type[np.number], int] = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
                                            np.float64: 6, np.float32: 7, np.uint16: 8}
_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
_PREAMBLE = struct.Struct("<9sQB")  # magic, version, dtype code
_COUNTS = struct.Struct("<QQ")  # sequence count, document-index count


def index_bytes(sequence_lengths: np.ndarray | list[int], document_indices: np.ndarray | list[int],
                dtype: type[np.number] = np.int32) -> bytes:
    """The whole ``.idx`` file for these sequence lengths and document indices (leading 0 included)."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    docs = np.asarray(document_indices, dtype=np.int64)
    # Byte offset of each sequence: the exclusive running sum of lengths x itemsize, in int64 as megatron.
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    return b"".join((_PREAMBLE.pack(INDEX_HEADER, INDEX_VERSION, DTYPE_CODES[dtype]),
                     _COUNTS.pack(len(lengths), len(docs)),
                     lengths.tobytes(), pointers.tobytes(), docs.tobytes()))


def read_index(path: str | Path) -> tuple[np.ndarray, np.ndarray, type[np.number]]:
    """``(sequence_lengths int32, document_indices int64, dtype)`` of a (non-multimodal) ``.idx`` file."""
    buf = Path(path).read_bytes()
    magic, version, code = _PREAMBLE.unpack_from(buf, 0)
    if magic != INDEX_HEADER or version != INDEX_VERSION or code not in _DTYPES:
        raise ValueError(f"{path}: not a megatron indexed-dataset index (header {magic!r}, version {version}, "
                         f"dtype code {code})")
    n_seq, n_docs = _COUNTS.unpack_from(buf, _PREAMBLE.size)
    at = _PREAMBLE.size + _COUNTS.size
    lengths = np.frombuffer(buf, dtype=np.int32, count=n_seq, offset=at)
    docs = np.frombuffer(buf, dtype=np.int64, count=n_docs, offset=at + 12 * n_seq)  # past lengths + pointers
    return lengths, docs, _DTYPES[code]


class IndexedWriter:
    """Streams documents (or whole indexed datasets) into ``bin_path``; ``finalize`` writes the ``.idx``.

    The in-memory index is numpy chunks (4 bytes a sentence, 8 a document), not Python lists.
    """

    def __init__(self, bin_path: str | Path, dtype: type[np.number] = np.int32) -> None:
        self.dtype = dtype
        self._data: BinaryIO = open(bin_path, "wb")
        self._lengths: list[np.ndarray] = []
        self._doc_ends: list[np.ndarray] = []
        self._n_seq = 0

    def add_document(self, tokens: np.ndarray, lengths: list[int] | np.ndarray) -> None:
        """One document: its sentences' tokens concatenated, and each sentence's length."""
        lengths = np.asarray(lengths, dtype=np.int32)
        self._data.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._lengths.append(lengths)
        self._n_seq += len(lengths)
        self._doc_ends.append(np.array([self._n_seq], dtype=np.int64))

    def add_index(self, path_prefix: str | Path) -> None:
        """Append a whole indexed dataset (``<path_prefix>.bin/.idx``), as megatron's ``add_index`` does."""
        lengths, docs, dtype = read_index(f"{path_prefix}.idx")
        if dtype is not self.dtype:
            raise ValueError(f"{path_prefix}.idx holds {dtype.__name__} tokens, this writer {self.dtype.__name__}")
        self._lengths.append(lengths)
        self._doc_ends.append(docs[1:] + self._n_seq)
        self._n_seq += len(lengths)
        with open(f"{path_prefix}.bin", "rb") as fh:
            shutil.copyfileobj(fh, self._data)

    def finalize(self, idx_path: str | Path) -> None:
        """Close the ``.bin`` and write the ``.idx``."""
        self._data.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        docs = np.concatenate([np.zeros(1, np.int64), *self._doc_ends])
        with open(idx_path, "wb") as fh:
            fh.write(index_bytes(lengths, docs, self.dtype))

    def close(self) -> None:
        """Close the data file without writing an index (on failure)."""
        self._data.close()
