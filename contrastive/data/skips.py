"""One counter of broken samples for every reader: CLIP shard members and files of an image folder.

Real data has broken samples: a truncated JPEG inside a webdataset shard, a zero-byte file in an ImageNet copy.
Readers skip them, count them here by reason, log the first few (then every 1000th), and fail with
:class:`~contrastive.errors.DataError` only when their share of the samples seen exceeds ``max_skip_fraction``:
a few bad samples should not stop a run over millions of images, a broken download or a wrong folder should.
The fraction is checked while reading once 1000 samples have been seen, and by :meth:`SkipCounter.check` at the
end (so small data sets are judged too).
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

from contrastive.errors import ConfigError, DataError

log = logging.getLogger(__name__)

_LOG_FIRST = 10  # skipped samples logged (and kept as examples) one by one; after that every _LOG_EVERY-th
_LOG_EVERY = 1000
_CHECK_AFTER = 1000  # samples seen before the skip fraction is checked mid-stream (not at the end)

DEFAULT_FIX = ("re-download the broken shards (img2dataset --incremental) or delete / re-export the unreadable "
               "image files, or raise data.max_skip_fraction")


class SkipCounter:
    """Counts good and skipped samples by reason (thread-safe) and enforces ``max_skip_fraction``.

    A skipped sample is named by ``key`` (a shard member's key, or an image file's path relative to its folder)
    and ``url`` (the shard, or the image folder). ``tar_error`` (an unreadable shard tail, e.g. an interrupted
    download) counts once per error although the number of samples lost there is unknown; the CLIP export
    compares what it read with the shards' stats files.

    Args:
        max_skip_fraction: largest tolerated share of skipped samples among those seen, in [0, 1].
        where: what is being read, for messages ("embedding export", "stage training (stage 1)", ...).
        fix: the end of the DataError message: what the user should do (names the config key to raise).
    """

    def __init__(self, *, max_skip_fraction: float, where: str = "data", fix: str = DEFAULT_FIX):
        if not 0.0 <= max_skip_fraction <= 1.0:
            raise ConfigError(f"max_skip_fraction must be in [0, 1], got {max_skip_fraction}")
        self.max_skip_fraction = max_skip_fraction
        self.where = where
        self.fix = fix
        self.good = 0
        self.skipped: Counter[str] = Counter()
        self.examples: list[str] = []
        self._next_check = _CHECK_AFTER
        self._lock = threading.Lock()

    @property
    def seen(self) -> int:
        return self.good + sum(self.skipped.values())

    @property
    def fraction(self) -> float:
        return sum(self.skipped.values()) / max(1, self.seen)

    def ok(self, count: int = 1) -> None:
        """Count ``count`` good samples."""
        with self._lock:
            self.good += int(count)
            self._maybe_check_locked()

    def skip(self, *, reason: str, key: str, url: str = "", detail: str = "") -> None:
        """Count one skipped sample ``key`` (of shard / folder ``url``) and log it if among the first ones."""
        with self._lock:
            self.skipped[reason] += 1
            total = sum(self.skipped.values())
            message = f"{key} in {url or '?'}: {reason}{' (' + detail + ')' if detail else ''}"
            if len(self.examples) < _LOG_FIRST:
                self.examples.append(message)
            if total <= _LOG_FIRST or total % _LOG_EVERY == 0:
                log.warning("%s: skipped sample %s [%d skipped so far]", self.where, message, total)
            if self.seen >= _CHECK_AFTER:
                self._check_locked()

    def check(self) -> None:
        """Raise DataError if more than max_skip_fraction of the samples seen were skipped."""
        with self._lock:
            self._check_locked()

    def _maybe_check_locked(self) -> None:
        if self.seen >= self._next_check:
            self._next_check = self.seen + _CHECK_AFTER
            self._check_locked()

    def _check_locked(self) -> None:
        if self.seen and self.fraction > self.max_skip_fraction:
            raise DataError(
                f"{self.where}: {sum(self.skipped.values())} of {self.seen} samples are broken "
                f"({dict(self.skipped)}; e.g. {self.examples[:3]}), more than max_skip_fraction="
                f"{self.max_skip_fraction}: {self.fix}")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"good": self.good, "skipped": sum(self.skipped.values()), "seen": self.seen,
                    "skip_fraction": self.fraction, **{f"skipped_{k}": v for k, v in self.skipped.items()}}
