"""Reading the files mclpipe loads (checkpoints, stage models, soups, serving files, init and pretrained weights)
without running code.

``torch.load`` unpickles, and a pickle may name any importable callable and call it while it loads: a model file
planted in a run directory or the artifact store would run its code on whatever machine loads it (a digest beside
the file guards against truncation, not tampering: anyone can compute it). Every such read goes through
:func:`load_torch_file`: ``torch.load(weights_only=True)``, torch's restricted unpickler, which rebuilds tensors,
storages, plain containers (dict, OrderedDict, list, tuple, set), numbers, strings, bytes, None and torch's
dtypes, devices and sizes, and refuses any other global *before* calling it. mclpipe adds nothing to that
allow-list: what it writes is only those types (:func:`check_plain`, called by every writer), e.g. specs as dicts
and numpy's RNG state as a tensor.

A file that holds anything else (a planted pickle, or a training checkpoint written before this format, which kept
numpy's RNG state as a numpy array) is refused with :class:`UnsafeFileError`: one line naming the file and the
command that converts a file the user trusts (``mclpipe convert-checkpoint PATH``,
:func:`contrastive.engine.checkpoint.convert_to_safe_format`).
"""
from __future__ import annotations

import codecs
import collections
import dataclasses
import pickle
import re
from pathlib import Path, PosixPath, PurePosixPath, PureWindowsPath, WindowsPath
from typing import Any, BinaryIO

import numpy as np
import torch

from contrastive.errors import DataError

#: The leaves a file mclpipe writes may hold; containers: dict (OrderedDict), list, tuple, set.
PLAIN_LEAVES = (torch.Tensor, bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
                torch.Size)


class UnsafeFileError(DataError):
    """A file holds Python objects that loading it would have to run (a pickle beyond tensors and plain data)."""


def unsafe_file_error(path: Path | str, *, what: str, exc: BaseException, fix: str | None = None) -> UnsafeFileError:
    """The one line for a file a restricted unpickler refused: the file, the object it names, the fix (by default
    the conversion of a file an earlier mclpipe wrote)."""
    found = re.search(r"GLOBAL (\S+)", str(exc))
    holding = f"a pickled {found.group(1)}" if found else "pickled Python objects"
    fix = fix or (f"If an earlier mclpipe wrote it and you trust where it came from, convert it once with "
                  f"`mclpipe convert-checkpoint {path}`; otherwise delete it and rerun the step that writes it")
    return UnsafeFileError(f"{what} {path} holds {holding} that loading would have to run, so it was not loaded "
                           f"(mclpipe reads only tensors, arrays and plain data). {fix}")


def load_torch_file(source: Path | str | BinaryIO, *, what: str, path: Path | str | None = None,
                    map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(source, weights_only=True)``: tensors and plain data only, nothing in the file is called.

    ``what`` names the file's role in the message (e.g. "training checkpoint"); ``path`` is the file named when
    ``source`` is an open buffer. Raises :class:`UnsafeFileError` (one line) for anything else."""
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise unsafe_file_error(path if path is not None else source, what=what, exc=exc) from None


#: What :func:`load_array_pickle` rebuilds: numpy arrays (the function ``ndarray.__reduce__`` names, under numpy
#: 1's and 2's module names), their dtypes, and bytes as Python 3 pickles them at protocol 2.
_ARRAY_GLOBALS = {"numpy.core.multiarray._reconstruct": np.ndarray.__reduce__(np.zeros(1))[0],
                  "numpy._core.multiarray._reconstruct": np.ndarray.__reduce__(np.zeros(1))[0],
                  "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype, "_codecs.encode": codecs.encode}

#: What files of earlier mclpipe versions held beyond tensors and plain data, and nothing that runs code: numpy
#: arrays, their dtypes (numpy 2 pickles a dtype by its class) and scalars (the RNG state), and paths.
EARLIER_FORMAT_GLOBALS = {
    **_ARRAY_GLOBALS,
    "numpy.core.multiarray.scalar": np.float64(0).__reduce__()[0],
    "numpy._core.multiarray.scalar": np.float64(0).__reduce__()[0],
    **{f"numpy.dtypes.{name}": getattr(np.dtypes, name) for name in np.dtypes.__all__},
    **{f"pathlib.{cls.__name__}": cls for cls in (PurePosixPath, PosixPath, PureWindowsPath, WindowsPath)},
}


def load_earlier_format(path: Path, *, what: str) -> Any:
    """A torch file an earlier mclpipe wrote, still without running code: ``weights_only=True`` with
    :data:`EARLIER_FORMAT_GLOBALS` allowed (under the names files use). DataError naming the first other
    global the file holds (not a file mclpipe wrote), before anything of it is loaded."""
    needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    unknown = [name for name in needed if name not in EARLIER_FORMAT_GLOBALS]
    if unknown:
        raise DataError(f"{what} {path} holds a pickled {unknown[0]}, which mclpipe never stored, so it was not "
                        "loaded: it is not a file an earlier mclpipe wrote; delete it and rerun the step that "
                        "writes it")
    # all of them, not only ``needed``: a dtype's class is named by no GLOBAL the scan sees, yet its BUILD checks it
    with torch.serialization.safe_globals([(obj, name) for name, obj in EARLIER_FORMAT_GLOBALS.items()]):
        return torch.load(path, map_location="cpu", weights_only=True)


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ARRAY_GLOBALS.get(f"{module}.{name}")
        if found is None:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")
        return found


def load_array_pickle(handle: BinaryIO, *, path: Path | str, what: str, fix: str, encoding: str = "ASCII") -> Any:
    """A plain pickle (a dataset's own format, e.g. CIFAR-10's python batches) that may hold only plain data and
    numpy arrays: any other global is refused before it is called (:class:`UnsafeFileError` naming ``path`` and
    ``fix``)."""
    try:
        return _ArrayUnpickler(handle, encoding=encoding).load()
    except pickle.UnpicklingError as exc:
        if "GLOBAL" not in str(exc):
            raise
        raise unsafe_file_error(path, what=what, exc=exc, fix=fix) from None


def check_plain(value: Any, *, what: str, where: str = "") -> None:
    """TypeError naming the first entry of ``value`` that :func:`load_torch_file` would refuse (a numpy array, a
    dataclass, any other object): a writer stores only what reads back without running code."""
    if isinstance(value, PLAIN_LEAVES):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, what=what, where=f"{where}[{key!r}] (key)")
            check_plain(item, what=what, where=f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            check_plain(item, what=what, where=f"{where}[{index}]")
        return
    raise TypeError(f"{what}{where} is a {type(value).__module__}.{type(value).__qualname__}: mclpipe's files hold "
                    "only tensors and plain data (dicts, lists, numbers, strings), so that they load without "
                    "unpickling code; store it as one of those (contrastive.engine.safe_load)")


def plain_copy(value: Any, *, what: str, where: str = "") -> Any:
    """``value`` with what earlier versions stored turned into plain data: numpy arrays into tensors (string arrays
    into lists), numpy scalars into numbers, dataclasses into dicts, paths into strings. DataError naming anything
    else."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OUS":
            return [plain_copy(item, what=what, where=f"{where}[{i}]") for i, item in enumerate(value.tolist())]
        if value.dtype == np.uint32:  # numpy's RNG key: as capture_rng stores it now
            value = value.astype(np.int64)
        return torch.from_numpy(np.array(value, copy=True))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        items = [(plain_copy(k, what=what, where=where), plain_copy(v, what=what, where=f"{where}[{k!r}]"))
                 for k, v in value.items()]
        if not isinstance(value, collections.OrderedDict):
            return dict(items)
        copied = collections.OrderedDict(items)  # a state dict: its module versions ride along as _metadata
        if hasattr(value, "_metadata"):
            copied._metadata = plain_copy(value._metadata, what=what, where=f"{where}._metadata")
        return copied
    if isinstance(value, (list, tuple, set, frozenset)) and not isinstance(value, torch.Size):
        items = [plain_copy(item, what=what, where=f"{where}[{i}]") for i, item in enumerate(value)]
        return type(value)(items) if type(value) in (list, tuple, set, frozenset) else list(items)
    if isinstance(value, PLAIN_LEAVES):
        return value
    raise DataError(f"{what}{where} is a {type(value).__module__}.{type(value).__qualname__}, which mclpipe never "
                    "stores: this file was not written by mclpipe and cannot be converted; delete it and rerun the "
                    "step that writes it")
