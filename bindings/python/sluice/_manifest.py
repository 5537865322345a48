"""sluice.write_manifest: the manifest of a model, written by the C
library's one writer (sluice_manifest_write, which `sluice manifest` runs
too), so that a Python-only user never needs the C build's command."""
import os as _os

from . import open as _open, parse_size, _fspath
from ._sluice import manifest_sign as _manifest_sign

_VERSIONS = {2: 2, 1: 1, "flat": 0}


def _sidecar(path):
    """Where sluice.open finds a model's manifest by itself: F.manifest.json
    beside a single file F, sluice.manifest.json in a directory."""
    p = _os.fspath(path)
    if _os.path.isdir(p):
        return _os.path.join(p, "sluice.manifest.json")
    return p + ".manifest.json"


def write_manifest(path, out=None, *, version=2, chunk="16M", parts=None, worlds=(2, 4, 8),
                   threads=None, sign_key=None, signature=None, **open_args):
    """Writes the manifest of the model at path (a .safetensors file, a
    directory, a *.safetensors.index.json) and returns where it went.

    out: the file (replaced atomically); None: the sidecar sluice.open
    finds by itself (F.manifest.json beside a file F, sluice.manifest.json
    in a directory); an int: a file descriptor to write to (1: stdout).
    version: 2 (default: tensors' dtype, shape and size, files' header
    digests), 1 or "flat" (for older readers); SHA-256 (BLAKE3:
    `sluice manifest --algorithm blake3`). chunk: version 2: tensors larger also get one
    digest per chunk of this size ("16M" default; 0 or None: none), so a
    range verifies alone. parts: version 2: a rules file path, the rules'
    text (str with a newline), or "builtin" (docs/parallel.md): each tensor
    they split also gets the digests of its tensor-parallel parts for each
    of worlds. threads: hashing threads (None: every CPU). open_args: as
    sluice.open takes them (remote locations too). Raises sluice.Error
    (ReadError, FileChangedError, ...) when a tensor or file could not be
    read; nothing is written then. sign_key: an Ed25519 private key (PEM,
    PKCS#8, as `sluice keygen` writes it): the manifest is then signed, as
    `sluice sign` signs it, into signature (default: the manifest's path +
    ".sig", where sluice.open(..., trusted_keys=) looks); raises
    sluice.SignatureError for an unusable key (the manifest stays
    written, unsigned). Signing needs a file: out cannot be a
    descriptor."""
    if version not in _VERSIONS:
        raise ValueError(f"version must be 2, 1 or 'flat', not {version!r}")
    v = _VERSIONS[version]
    chunk_bytes = parse_size(chunk, "chunk") if chunk not in (None, 0) else 0
    if v != 2:
        if parts is not None:
            raise ValueError("parts needs version 2")
        chunk_bytes = 0
    rules = None
    if parts is not None:
        if not isinstance(parts, (str, bytes, _os.PathLike)):
            raise TypeError(f"parts must be a path, rules text or 'builtin', not "
                            f"{type(parts).__name__}")
        if isinstance(parts, str) and "\n" in parts:
            rules = parts
        elif parts == "builtin":
            rules = "builtin"
        else:
            with open(_fspath(parts, "parts"), "rb") as f:
                rules = f.read().decode("utf-8")
    worlds = tuple(int(w) for w in worlds)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 0):
        raise TypeError("threads must be a non-negative int or None")
    if signature is not None and sign_key is None:
        raise ValueError("signature needs sign_key")
    fd = -1
    if isinstance(out, int) and not isinstance(out, bool):
        if sign_key is not None:
            raise ValueError("sign_key needs a file to sign: out cannot be a descriptor")
        fd, dest = out, None
    else:
        dest = _fspath(out, "out") if out is not None else _sidecar(_fspath(path))
    open_args.setdefault("verify", "off")  # its index only: the bytes are hashed as they are
    open_args.setdefault("pool", 4096)
    import warnings
    with warnings.catch_warnings():  # no manifest yet is the point: no UnverifiedWarning
        warnings.simplefilter("ignore", category=Warning)
        model = _open(path, **open_args)
    with model:
        model._m.write_manifest(dest, fd, v, chunk_bytes, rules, worlds, threads or 0)
    if sign_key is not None:
        _manifest_sign(dest, _fspath(sign_key, "sign_key"),
                       None if signature is None else _fspath(signature, "signature"))
    return dest if dest is not None else fd
