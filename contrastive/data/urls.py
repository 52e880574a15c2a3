"""Where tar shards are: brace-pattern URLs, local or remote, and the member names of an image in a shard.

A spec is a brace pattern (``/data/cc12m/{00000..01242}.tar``), several joined by ``::``, or a list of them; a URL
is a local path or anything webdataset opens (``pipe:cmd``, ``http(s)://``, ``gs://``); ``s3://bucket/key`` is
read through ``pipe:aws s3 cp s3://bucket/key -``. Shared by the image-text reader and the indexed shard reader
(:mod:`contrastive.data.shards`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import braceexpand

from contrastive.errors import ConfigError, DataError

#: The member suffixes that hold a sample's image in a webdataset shard (as img2dataset writes them).
SHARD_IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
REMOTE_PREFIXES = ("pipe:", "http://", "https://", "s3://", "gs://", "sftp://", "ais://", "hf://")


def is_remote(url: str) -> bool:
    return url.startswith(REMOTE_PREFIXES)


def expand_urls(spec: str | Sequence[str], *, check_local: bool = True) -> list[str]:
    """Brace-expand one pattern, several joined by ``::``, or a list of them, into shard URLs (in order).

    Local paths must exist when ``check_local`` (remote URLs are only checked when opened).
    """
    patterns = [spec] if isinstance(spec, str) else list(spec)
    urls: list[str] = []
    for pattern in patterns:
        for part in str(pattern).split("::"):
            if part.strip():
                urls.extend(braceexpand.braceexpand(part.strip()))
    if not urls:
        raise ConfigError(f"no shard URLs in {spec!r}: set data.shards to a pattern such as "
                          "/data/cc12m/{00000..01242}.tar")
    if check_local:
        missing = [u for u in urls if not is_remote(u) and not Path(u.removeprefix("file:")).is_file()]
        if missing:
            raise DataError(f"{len(missing)} of {len(urls)} shards do not exist (e.g. {missing[0]}): download them "
                            "with img2dataset (see docs/clip.md) or fix data.shards")
    return urls


def to_webdataset_url(url: str) -> str:
    """webdataset has no s3 opener; read s3 objects through the AWS CLI like open_clip's docs do."""
    if url.startswith("s3://"):
        return f"pipe:aws s3 cp {url} -"
    return url
