"""Decoding one image file into the square uint8 pixels a dataset holds: the decoder every reader of image files
shares (a prepared image folder, a file-backed dataset, tar shards; the image and image-text modalities).

Every image is EXIF-rotated, converted to RGB, centre-cropped to a square and resized to ``image_size``.

Two decodings (``decode_scale``), the same for a prepared folder's ``memory`` and ``files`` storages:

- ``full``: PIL decodes the whole image (JPEGs at a power-of-two reduction only where that still leaves the
  square >= ``image_size``, which ImageNet-size photos at 224 px never allow) and one bicubic resampling makes the
  square.
- ``auto``: JPEGs are decoded by libjpeg-turbo (``simplejpeg``), at the smallest of its fast DCT scales (1, 1/2,
  1/4, 1/8) whose shorter side is still >= ``image_size`` (a 500 x 375 photo at 224 px: whole; a 1000 x 750 one:
  1/2), and torch's antialiased bicubic uint8 kernel makes the square; other formats, and JPEGs libjpeg-turbo will
  not decode (CMYK), as ``full``. Where the whole image is decoded the pixels equal ``full``'s to rounding (mean
  absolute difference about 0.01 of 255 on the benchmark's 500 x 375 photos; both kernels are Keys' a = -0.5
  cubic); a reduced scale holds the same detail at a few levels' difference
  (``tests/unit/data/test_image_files.py`` bounds both), so the choice is part of the prepared dataset's key
  (with the revision ``AUTO_DECODER``). About 1.6x the images per CPU-second of ``full`` through the reader
  (BENCHMARKS.md).
"""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import numpy as np
from PIL import Image, ImageOps

from contrastive.data.dataset import digest_array, read_twice

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
DECODE_SCALES = ("auto", "full")  # see the module docstring
# The "auto" decoder's revision, in the key of every folder prepared with it: 2 = power-of-two DCT scales and torch's
# resampling (1, which nothing reuses: any n/8 scale and PIL's, pixels about 1.7 levels off "full").
AUTO_DECODER = 2
_ORIENTATION = 0x0112
_JPEG_SOI = b"\xff\xd8"
_EXIF_HEADER = b"Exif\x00\x00"  # the APP1 segment that holds EXIF, within the first segments of a JPEG
_JPEG_DATA_MARKERS = (0xDA, 0xD9)  # start of scan, end of image: the header segments are over
_TURBO_FAST_DIVISORS = (8, 4, 2)  # 1/8, 1/4, 1/2: libjpeg-turbo's vectorised reduced IDCTs
_TURBO_COLOURSPACES = ("RGB", "YCbCr", "Gray")  # libjpeg-turbo converts these to RGB; CMYK / YCCK go to PIL


def _files_fingerprint(source: Path, rel_paths: Sequence[str]) -> str:
    """sha256 over (path, size, mtime) of every file: any added, removed or edited image changes it."""
    digest = hashlib.sha256()
    for rel in rel_paths:
        stat = (source / rel).stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------- decoding
def load_square_rgb(path: Path | IO[bytes], *, size: int, decode_scale: str = "full",
                    resample: bool = True) -> np.ndarray:
    """Decode one image: EXIF-rotate, RGB, centre square crop, resize -> uint8 (size, size, 3).

    ``path``: a file or a binary file object. ``decode_scale``: "full" (PIL) or "auto" (JPEGs decoded at a reduced
    DCT scale that keeps the shorter side >= ``size``); see the module docstring for what "auto" changes.
    ``resample=False`` (``train.resample_on_gpu``): a JPEG that "auto" decodes comes back as its centre square at
    the decoded side, uint8 (n, n, 3), for :func:`resample_squares` to resample elsewhere; every other image (PIL's
    path) is resampled here as always, so it arrives at ``size``.
    """
    if decode_scale == "auto":
        data = _read_bytes(path)
        square = _jpeg_square(data, size=size, resample=resample) if data[:2] == _JPEG_SOI else None
        if square is not None:
            return square
        path = io.BytesIO(data)  # not a JPEG, or one libjpeg-turbo will not decode: PIL decides
    with Image.open(path) as img:
        img.draft("RGB", (size, size))  # JPEG: decode at a power-of-two scale that is still >= size
        img = ImageOps.exif_transpose(img).convert("RGB")
        return _square(img, size=size)


def _square(img: Image.Image, *, size: int) -> np.ndarray:
    """The centre square of side min(width, height) of the PIL image ``img``, resampled (bicubic) to uint8
    (size, size, 3)."""
    width, height = img.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    img = img.resize((size, size), Image.Resampling.BICUBIC, box=(left, top, left + side, top + side))
    return np.asarray(img, dtype=np.uint8)


def _read_bytes(path: Path | IO[bytes]) -> bytes:
    if hasattr(path, "read"):
        path.seek(0)
        return path.read()
    with open(path, "rb") as handle:
        return handle.read()


def _jpeg_square(data: bytes, *, size: int, resample: bool = True) -> np.ndarray | None:
    """The JPEG ``data`` as :func:`load_square_rgb` "auto" gives it: libjpeg-turbo decodes it at the smallest of
    its fast scales (1, 1/2, 1/4, 1/8) whose shorter side is still >= ``size``, the EXIF rotation is undone, and
    the centre square is resampled to ``size`` by torch's antialiased bicubic uint8 kernel (vectorised: about 4x
    faster than PIL's here). None when libjpeg-turbo will not decode it (CMYK, a damaged stream): PIL then decides.
    ``resample=False``: the centre square at its decoded side, (n, n, 3).

    Only the power-of-two scales: libjpeg-turbo has vectorised IDCTs for those alone, and its other n/8 scales
    decode slower than full size (5/8: 0.84 ms vs 0.76 ms for a 500 x 375 photo here), so a 500 x 375 photo at
    224 px is decoded whole and a 1000 x 750 one at 1/2.
    """
    import torch

    square = _jpeg_centre_square(data, size=size)
    if square is None:
        return None
    if resample and square.shape[-1] != size:
        square = torch.nn.functional.interpolate(square, size=(size, size), mode="bicubic", antialias=True)
    return square[0].permute(1, 2, 0).contiguous().numpy()  # contiguous already: no copy


def _jpeg_centre_square(data: bytes, *, size: int) -> "torch.Tensor | None":
    """The decoding half of :func:`_jpeg_square`: uint8 (1, 3, n, n) in channels_last, the upright centre square
    at the decoded scale (n >= ``size`` unless the image is smaller); None where libjpeg-turbo will not decode."""
    import simplejpeg
    import torch

    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace not in _TURBO_COLOURSPACES:
            return None
        shorter = min(width, height)
        divisor = next((d for d in _TURBO_FAST_DIVISORS if shorter >= size * d), 1)
        # libjpeg-turbo decodes at the largest reduction that leaves both sides at least these: exactly 1/divisor.
        array = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=-(-height // divisor),
                                       min_width=-(-width // divisor))
    except ValueError:
        return None
    image = _exif_upright(torch.from_numpy(array), orientation=_jpeg_orientation(data))  # (H, W, 3), a view
    # The square's box scaled by 1/divisor itself (a reduced side is rounded up), to the nearest pixel.
    side, rows, cols = shorter / divisor, image.shape[0], image.shape[1]
    n = max(1, min(rows, cols, round(side)))
    top = max(0, min(round((rows - side) / 2), rows - n))
    left = max(0, min(round((cols - side) / 2), cols - n))
    # channels_last in and out: torch's vectorised uint8 path (about 2x its strided one), and the result's
    # (size, size, 3) view is contiguous. unsqueeze before permute: a batch stride of 3 (permute, then unsqueeze)
    # makes a portrait square look channels-first to interpolate, whose output then needs a transposing copy
    # (0.25 ms of the ~1.6 ms an image costs; the pixels are the same).
    square = image[top:top + n, left:left + n].unsqueeze(0).permute(0, 3, 1, 2)
    return square.contiguous(memory_format=torch.channels_last)


def resample_squares(flat: "torch.Tensor", sides: Sequence[int], *, size: int) -> "torch.Tensor":
    """The squares packed in ``flat`` resampled to ``size``, on ``flat``'s device: uint8 (b, 3, size, size).

    ``flat``: uint8, the (n, n, 3) squares of :func:`load_square_rgb` ``resample=False`` back to back; ``sides``:
    each one's n. ``train.resample_on_gpu`` calls it on the GPU for a batch the workers shipped unresampled; the
    squares of one side go through together (one batch of kernels a side: a batch of same-size photos, one).

    The pixels are the workers' (:func:`_jpeg_square`'s uint8 kernel) to rounding: that kernel resamples the width
    first, rounds and clamps to uint8, then the height; the same two passes in float32 here, each rounded and
    clamped, differ from it only by its fixed-point weights: at most 1 level down-sampling, 2 up-sampling, about
    0.005 levels on average on noise (``tests/unit/data/test_gpu_resample.py``). One float pass without the middle
    rounding would differ by up to 25 levels where a pass overshoots (noise, sharp edges).
    """
    import torch

    sides = np.asarray(sides, dtype=np.int64)
    out = torch.empty((len(sides), 3, size, size), dtype=torch.uint8, device=flat.device)
    ends = np.cumsum(sides * sides * 3)
    starts = ends - sides * sides * 3
    for side in np.unique(sides).tolist():
        members = np.flatnonzero(sides == side).tolist()
        group = torch.stack([flat[starts[i]:ends[i]].view(side, side, 3) for i in members]).permute(0, 3, 1, 2)
        if side != size:
            group = _two_pass_bicubic(group, size=size)
        if len(members) == len(sides):
            out.copy_(group)
        else:  # mixed sides: one copy an image (an index tensor would be a blocking host -> GPU copy)
            for j, i in enumerate(members):
                out[i].copy_(group[j])
    return out


def _two_pass_bicubic(group: "torch.Tensor", *, size: int) -> "torch.Tensor":
    """uint8 (k, 3, n, n) -> (k, 3, size, size): antialiased bicubic, width then height, rounded and clamped to
    uint8 levels between the passes as torch's CPU uint8 kernel does (see :func:`resample_squares`)."""
    import torch

    x = group.float()
    for shape in ((x.shape[-2], size), (size, size)):  # the width first, then the height
        x = torch.nn.functional.interpolate(x, size=shape, mode="bicubic", antialias=True).round_().clamp_(0, 255)
    return x.to(torch.uint8)


def _jpeg_orientation(data: bytes) -> int:
    """The EXIF orientation (1..8) of JPEG ``data``; 1 when it has no EXIF block (most, and parsed only then)."""
    if not _has_exif_segment(data):
        return 1
    with Image.open(io.BytesIO(data)) as img:
        return int(img.getexif().get(_ORIENTATION, 1))


def _has_exif_segment(data: bytes) -> bool:
    """Whether an APP1 "Exif" segment precedes the JPEG's image data: walks the header's segment lengths (a few
    steps) instead of searching the bytes (tens of microseconds an image)."""
    at = 2  # after SOI
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_DATA_MARKERS:
            return False
        if marker == 0xE1 and data[at + 4:at + 4 + len(_EXIF_HEADER)] == _EXIF_HEADER:
            return True
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return False


def _exif_upright(image: "torch.Tensor", *, orientation: int) -> "torch.Tensor":
    """(H, W, 3) as it is to be shown, for EXIF ``orientation`` (the operations of PIL's exif_transpose)."""
    if orientation in (5, 6, 7, 8):  # stored on its side: transpose first
        image = image.transpose(0, 1)
    flip_rows = orientation in (3, 4, 7, 8)
    flip_cols = orientation in (2, 3, 6, 7)
    dims = [d for d, flip in ((0, flip_rows), (1, flip_cols)) if flip]
    return image.flip(dims) if dims else image


def read_image_file(path: Path) -> bytes:
    """The bytes of an image file. FileNotFoundError when it is gone (its sample is broken); an I/O error is tried
    once more, then DataReadError naming the file: a read error is never counted as a broken image."""
    return read_twice(Path(path).read_bytes, path=path, what="the image", missing_is_broken=True)


def square_or_error(data: bytes, *, size: int, decode_scale: str, resample: bool = True) -> np.ndarray | str:
    """:func:`load_square_rgb` of encoded bytes already read, or the error text ("OSError: ...") when they are no
    image: whatever the decoder raises on bytes in memory means the sample is broken, not its file unreadable."""
    try:
        return load_square_rgb(io.BytesIO(data), size=size, decode_scale=decode_scale, resample=resample)
    except Exception as err:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, DecompressionBombError
        return f"{type(err).__name__}: {err}"


def _try_load(path: Path, size: int, decode_scale: str) -> np.ndarray | str:
    try:
        data = read_image_file(path)
    except FileNotFoundError as err:
        return f"{type(err).__name__}: {err}"
    return square_or_error(data, size=size, decode_scale=decode_scale)


def _decode_all(source: Path, rel_paths: Sequence[str], *, out: np.ndarray, size: int,
                decode_scale: str = "full") -> dict[str, str]:
    """Decode into ``out`` (N, size, size, 3) row by row; returns rel path -> error for unreadable files."""
    failures = {}
    workers = min(8, os.cpu_count() or 1)  # PIL decodes outside the GIL, so threads give real parallelism
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for row, (rel, result) in enumerate(zip(rel_paths, pool.map(lambda r: _try_load(source / r, size, decode_scale),
                                                                    rel_paths))):
            if isinstance(result, str):
                failures[rel] = result
            else:
                out[row] = result
    return failures

def decode_scale_of(params: dict) -> str:
    """The decoding a prepared folder's params ask for ("full" for folders prepared before the setting)."""
    return str(params.get("decode_scale", "full"))


# --------------------------------------------------------------------------------------------- storage "files"
def file_index_digest(*, index: dict[str, np.ndarray], params: dict) -> str:
    """sha256 hex identifying a file-backed dataset without reading a pixel.

    Covers the index arrays (ids, split, labels), the output size and the source's fingerprint (every file's
    path, size and mtime, ``params["files_sha256"]``) and the decoding (``decode_scale``): an edited image, a new
    label, a new split or another decoding all change it.
    """
    digest = hashlib.sha256()
    digest.update(f"files|{params['image_size']}|{params['source']}|{params['files_sha256']}".encode())
    if decode_scale_of(params) != "full":  # other pixels (absent for "full": earlier digests stay as they were)
        digest.update(f"|decode_scale={decode_scale_of(params)}".encode())
    for name in sorted(index):
        digest.update(f"|{name}|".encode())
        digest_array(digest, index[name])
    return digest.hexdigest()
