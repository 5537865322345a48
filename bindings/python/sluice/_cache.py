"""sluice.Cache: a persistent cache directory administered from Python, as
`sluice cache` does (ls, du, gc, clear, verify), shared with the command,
the models that use it (cache_dir=) and other processes."""
import os as _os
from collections import namedtuple

from . import _features, _sluice

CacheEntry = namedtuple("CacheEntry",
                        "algorithm digest bytes source created_ns last_access_ns present")
CacheEntry.__doc__ = """One verified blob: its digest (algorithm, lower-case hex), its size,
where it was fetched from (credentials and query left out), when it was
stored and last used (CLOCK_REALTIME ns), and whether its file is there."""
CacheUsage = namedtuple("CacheUsage", "bytes entries")
CacheFreed = namedtuple("CacheFreed", "bytes entries")
CacheVerifyItem = namedtuple("CacheVerifyItem", CacheEntry._fields + ("why",))
CacheVerifyReport = namedtuple("CacheVerifyReport", "checked dropped items")


class Cache:
    """Cache(dir=None): opens (and creates, repairing its index) a cache
    directory; None: $SLUICE_CACHE_DIR, else $XDG_CACHE_HOME/sluice (else
    ~/.cache/sluice); "" is refused (ValueError). A context manager. One call at a time per Cache
    (another thread's meanwhile raises BusyError); any number of Caches
    and models may use one directory at once. UnsupportedError when this
    build has no SQLite."""

    def __init__(self, dir=None):
        _features.require("cache")
        if dir is not None and not _os.fspath(dir):
            # the library would take "" for the default directory: a
            # variable left empty must not clear the user's cache
            raise ValueError("dir must name a directory (None: the default one), not ''")
        self._c = _sluice.Cache(dir)

    @property
    def path(self):
        """The cache directory."""
        return self._c.path

    def ls(self):
        """[CacheEntry], least recently used first."""
        return [CacheEntry(*row) for row in self._c.ls()]

    def du(self):
        """CacheUsage(bytes, entries) recorded."""
        return CacheUsage(*self._c.du())

    def gc(self, max_bytes):
        """Deletes least recently used blobs until at most max_bytes (an
        int or "10G"-style) remain, and entries whose blob is gone:
        CacheFreed(bytes, entries)."""
        from . import parse_size
        n = parse_size(max_bytes, "max_bytes") if isinstance(max_bytes, str) else max_bytes
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"max_bytes must be an int or a size string, "
                            f"not {type(max_bytes).__name__}")
        if n < 0:
            raise ValueError(f"max_bytes must be >= 0, not {n}")
        return CacheFreed(*self._c.gc(n))

    def clear(self):
        """Deletes every blob and entry (and the memo): CacheFreed."""
        return CacheFreed(*self._c.clear())

    def verify(self):
        """Rehashes every blob, deletes those whose bytes do not match
        their name: CacheVerifyReport(checked, dropped, items), items the
        blobs dropped or recorded back, each with why."""
        checked, dropped, rows = self._c.verify()
        return CacheVerifyReport(checked, dropped, [CacheVerifyItem(*r) for r in rows])

    def close(self):
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<sluice.Cache {self.path!r}>"
