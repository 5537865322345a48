"""What this build of the package has (sluice.features()), and the
UnsupportedError that names the Debian package a missing feature needs."""
from ._errors import E_UNSUPPORTED, UnsupportedError
from . import _sluice

# feature -> (what it is, the Debian package that brings it at build time)
_NEEDS = {
    "remote": ("remote models (http://, https://)", "libcurl4-openssl-dev"),
    "s3": ("remote models (s3://)", "libcurl4-openssl-dev"),
    "cache": ("the persistent cache (cache_dir=, sluice.Cache)", "libsqlite3-dev"),
    "blake3": ("BLAKE3 digests", "librust-blake3-dev"),
    "metrics_http": ("the metrics endpoint (sluice.serve_metrics)", "libmicrohttpd-dev"),
}


def features():
    """{"remote", "s3", "cache", "blake3", "metrics_http": bool}: what this
    build has, as the project's CMake configuration found it when the
    package was built (bindings/python/setup.py)."""
    return dict(_sluice.features())


def unsupported(feature):
    """The UnsupportedError for a feature this build lacks."""
    what, pkg = _NEEDS[feature]
    return UnsupportedError(
        E_UNSUPPORTED,
        f"this build of the sluice package has no {what}: it was built without {pkg} "
        f"(apt-get install {pkg}, then reinstall the package: "
        f"pip install --no-build-isolation --no-deps ./bindings/python)")


def require(feature):
    """Raises unsupported(feature) unless this build has it."""
    if not _sluice.features()[feature]:
        raise unsupported(feature)


_SCHEMES = (("http://", "remote"), ("https://", "remote"), ("s3://", "s3"), ("hf://", "remote"))


def require_for_location(location):
    """The feature check of a location string: http(s)://, hf:// and s3:// need
    libcurl; anything else is the library's to judge (a path)."""
    if isinstance(location, bytes):
        location = location.decode("utf-8", "surrogateescape")
    if not isinstance(location, str):
        return
    low = location[:8].lower()
    for prefix, feature in _SCHEMES:
        if low.startswith(prefix):
            require(feature)
            return
