"""The exception classes of sluice, one per family of SLUICE_E_* codes.

Every one is a sluice.Error with .code (the negative SLUICE_E_* value) and
.message (the library's message, unchanged but for bytes that are not
UTF-8, such as a quoted path's, which become U+FFFD). Where a built-in exception
means the same thing, the class derives from it too, so that ordinary
handlers catch it: NotFoundError is a KeyError, ReadError an OSError,
InvalidArgumentError a ValueError, OutOfMemoryError a MemoryError,
BufferTooSmallError a ValueError, UnsupportedError a NotImplementedError.
"""

# The codes of sluice.h, by name (they never change value).
OK = 0
E_INVAL, E_NOMEM, E_IO, E_NOT_FOUND, E_NO_FILES = -1, -2, -3, -4, -5
E_HEADER_SHORT, E_HEADER_TOO_LARGE, E_HEADER_UTF8, E_HEADER_JSON = -10, -11, -12, -13
E_HEADER_NOT_OBJECT, E_ENTRY, E_DTYPE, E_SHAPE, E_OFFSETS = -14, -15, -16, -17, -18
E_INTEGER, E_OVERFLOW, E_SIZE_MISMATCH, E_LAYOUT, E_DUPLICATE = -19, -20, -21, -22, -23
E_METADATA = -24
E_INDEX, E_INDEX_SHARD, E_INDEX_MISMATCH = -30, -31, -32
E_MANIFEST, E_MANIFEST_FORMAT, E_MANIFEST_DIGEST = -40, -41, -42
E_MANIFEST_DUPLICATE, E_MANIFEST_UNKNOWN, E_MANIFEST_MISSING, E_CHECKSUM = -43, -44, -45, -46
E_MANIFEST_MISMATCH, E_SIGNATURE = -47, -48
E_TOO_LARGE, E_POOL_EXHAUSTED, E_BUSY, E_FILE_CHANGED, E_CANCELLED = -50, -51, -52, -53, -54
E_REMOTE = -55
E_BUFFER, E_UNSUPPORTED = -60, -61


class Error(Exception):
    """A failure reported by the sluice library.

    code: the SLUICE_E_* value (negative int); message: the library's text.
    name: the tensor concerned, when the binding knows it (else None).
    """

    def __init__(self, code, message, name=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.name = name

    def __str__(self):
        return self.message

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.name))


class InvalidArgumentError(Error, ValueError):
    """SLUICE_E_INVAL: a bad argument, the API misused, or a closed model."""


class ClosedError(InvalidArgumentError):
    """The model was closed (raised by the binding, code SLUICE_E_INVAL)."""


class OutOfMemoryError(Error, MemoryError):
    """SLUICE_E_NOMEM."""


class ReadError(Error, OSError):
    """SLUICE_E_IO: a system call failed (the message has errno and file)."""


class FileChangedError(ReadError):
    """SLUICE_E_FILE_CHANGED: a file shrank or vanished after open."""


class NotFoundError(Error, KeyError):
    """SLUICE_E_NOT_FOUND: no tensor of that name."""


class NoFilesError(Error, FileNotFoundError):
    """SLUICE_E_NO_FILES: the path names no .safetensors file."""


class HeaderError(Error):
    """SLUICE_E_HEADER_* .. SLUICE_E_METADATA: a .safetensors header broke a rule."""


class ShardIndexError(Error):
    """SLUICE_E_INDEX*: a *.safetensors.index.json is bad or disagrees with its shards."""


class ManifestError(Error):
    """SLUICE_E_MANIFEST*: the manifest cannot be used (unreadable, malformed, ...)."""


class ManifestMismatchError(ManifestError):
    """SLUICE_E_MANIFEST_MISMATCH: a header disagrees with a version 2
    manifest (a tensor's dtype, shape or size, a file's size or header
    digest): the file was changed to be read otherwise than it was signed
    off."""


class SignatureError(Error):
    """SLUICE_E_SIGNATURE: trusted keys were given and the manifest's
    signature is missing, malformed, by another key or invalid, or a
    trusted key file is unusable. Deliberately not a ManifestError: code
    that falls back to opening without a manifest on ManifestError must
    not turn a signature failure into an unverified open."""


class ChecksumError(Error):
    """SLUICE_E_CHECKSUM: the bytes read do not match the manifest's digest."""


class PoolError(Error):
    """The buffer pool cannot hold a tensor (base of the two below)."""


class TooLargeError(PoolError):
    """SLUICE_E_TOO_LARGE: a tensor larger than the whole pool."""


class PoolExhaustedError(PoolError):
    """SLUICE_E_POOL_EXHAUSTED: live arrays hold the room a tensor needs."""


class BusyError(Error):
    """SLUICE_E_BUSY."""


class CancelledError(Error):
    """SLUICE_E_CANCELLED."""


class RemoteError(ReadError):
    """SLUICE_E_REMOTE: a remote source refused a request for good (403, 404,
    416, ...): not retried on that source. This binding is built without
    libcurl, so it meets this code only through a library that has it."""


class BufferTooSmallError(Error, ValueError):
    """SLUICE_E_BUFFER: an output buffer given to the library is too small."""


class UnsupportedError(Error, NotImplementedError):
    """SLUICE_E_UNSUPPORTED: the library was built without what the call needs
    (a BLAKE3 manifest in a build without the BLAKE3 sources, say)."""


_BY_CODE = {
    E_INVAL: InvalidArgumentError, E_NOMEM: OutOfMemoryError, E_IO: ReadError,
    E_NOT_FOUND: NotFoundError, E_NO_FILES: NoFilesError,
    E_INDEX: ShardIndexError, E_INDEX_SHARD: ShardIndexError, E_INDEX_MISMATCH: ShardIndexError,
    E_CHECKSUM: ChecksumError, E_MANIFEST_MISMATCH: ManifestMismatchError,
    E_SIGNATURE: SignatureError, E_TOO_LARGE: TooLargeError,
    E_POOL_EXHAUSTED: PoolExhaustedError, E_BUSY: BusyError,
    E_FILE_CHANGED: FileChangedError, E_CANCELLED: CancelledError, E_REMOTE: RemoteError,
    E_BUFFER: BufferTooSmallError, E_UNSUPPORTED: UnsupportedError,
}
for _c in range(E_METADATA, E_HEADER_SHORT + 1):
    _BY_CODE[_c] = HeaderError
for _c in range(E_MANIFEST_MISSING, E_MANIFEST + 1):
    _BY_CODE[_c] = ManifestError


def error_class(code):
    """The exception class for a SLUICE_E_* code (Error for unknown ones)."""
    return _BY_CODE.get(code, Error)


def make_error(code, message, name=None):
    """An exception instance for code, carrying message unchanged."""
    if code == E_INVAL and message == "the model is closed":
        return ClosedError(code, message, name)
    return error_class(code)(code, message, name)


class UnverifiedWarning(UserWarning):
    """A model opened with nothing to check its bytes against: no manifest
    was given and none was found beside it (verify="default" or
    "if_present"). Its tensors load as they are on disk or on the wire.
    Warned once per model location (Python's default filter), from
    sluice.open and everything built on it (safe_open, load_file,
    load_shard, iter_weights, lazy_load, ...). Filter it to silence it,
    or turn it into an error (warnings.simplefilter("error",
    sluice.UnverifiedWarning)) to refuse unverified models; verify="off"
    is the caller's own choice and is not warned of."""
