"""The persistent cache's options (cache_dir, cache_bytes, trust_unchanged),
its stats and Model.cache_warning. A local model uses the cache for the
verified-once memo only (remote models, whose tensors the cache's blobs
hold, and sluice.Cache's ls/du/gc/verify are test_remote.py's part)."""
import os
import pathlib
import time

import pytest

import sluice
import stfile

CACHE_KEYS = ("disk_hits", "disk_hit_bytes", "disk_misses", "disk_stored", "disk_rotten",
              "disk_evicted", "memo_tensors", "memo_bytes", "disk_degraded", "disk_busy")


@pytest.fixture(autouse=True)
def no_cache_env(monkeypatch, tmp_path):
    """No cache from the environment: $SLUICE_CACHE_DIR unset, and the
    default directory under this test's own $XDG_CACHE_HOME."""
    monkeypatch.delenv("SLUICE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def settled(sharded):
    """The sharded model once its files are over a second old: the library
    records no file whose mtime or ctime is within the last second."""
    time.sleep(1.1)
    return sharded


def need_cache(model):
    """Skips when the package was built without SQLite (no cache at all)."""
    w = model.cache_warning
    if w is not None and "without SQLite" in w:
        pytest.skip(f"built without SQLite: {w}")


def load_all(model):
    """{name: bytes} of every tensor; the arrays are dropped at once."""
    return {k: model.get_tensor(k, raw=True).tobytes() for k in model.keys()}


def sizes(model):
    nbytes = [model.info(k).nbytes for k in model.keys()]
    return sum(1 for n in nbytes if n), sum(nbytes)


def test_memo_spares_the_second_load(settled, tmp_path):
    cache = tmp_path / "cache"
    with sluice.open(settled, cache_dir=cache, trust_unchanged=True) as m:  # a PathLike
        need_cache(m)
        assert m.cache_warning is None
        first = load_all(m)
        nonempty, total = sizes(m)
        st = m.stats()
        assert st["memo_tensors"] == 0 and st["memo_bytes"] == 0
        assert st["bytes_hashed"] == total and st["tensors_verified"] == nonempty
        assert st["disk_degraded"] == 0
    assert (cache / "index.sqlite").is_file()
    with sluice.open(settled, cache_dir=str(cache), trust_unchanged=True) as m:
        second = load_all(m)
        st = m.stats()
        assert st["memo_tensors"] == nonempty
        assert st["memo_bytes"] == total
        assert st["bytes_hashed"] == 0
        assert st["checksum_failures"] == 0 and st["disk_degraded"] == 0
        assert m.cache_warning is None
    assert second == first
    assert first == {k: raw for k, (_d, _s, raw) in stfile.read_model(settled).items()}


def test_memo_is_opt_in(settled, tmp_path):
    """Without trust_unchanged the same cache spares nothing."""
    cache = str(tmp_path / "cache")
    for _ in range(2):
        with sluice.open(settled, cache_dir=cache, trust_unchanged=True) as m:
            need_cache(m)
            load_all(m)
    with sluice.open(settled, cache_dir=cache) as m:
        load_all(m)
        nonempty, total = sizes(m)
        st = m.stats()
        assert st["memo_tensors"] == 0 and st["bytes_hashed"] == total


def test_a_touched_shard_is_hashed_again(settled, tmp_path):
    cache = str(tmp_path / "cache")
    with sluice.open(settled, cache_dir=cache, trust_unchanged=True) as m:
        need_cache(m)
        load_all(m)
        first_file = m.files[0]
        in_first = [k for k in m.keys() if m.info(k).file == first_file and m.info(k).nbytes]
        nonempty, _ = sizes(m)
    os.utime(first_file)  # a new mtime and ctime: no longer the file verified
    with sluice.open(settled, cache_dir=cache, trust_unchanged=True) as m:
        load_all(m)
        st = m.stats()
        assert in_first
        assert st["memo_tensors"] == nonempty - len(in_first)
        assert st["bytes_hashed"] == sum(m.info(k).nbytes for k in in_first)


def test_trust_unchanged_alone_uses_the_default_directory(settled, tmp_path):
    with sluice.open(settled, trust_unchanged=True) as m:
        need_cache(m)
        load_all(m)
        assert m.cache_warning is None
    assert (tmp_path / "xdg" / "sluice" / "index.sqlite").is_file()


def test_load_file_and_safe_open_forward_the_cache(settled, tmp_path):
    cache = tmp_path / "cache"
    first = sluice.load_file(settled, cache_dir=cache, trust_unchanged=True, raw=True)
    with sluice.safe_open(settled, raw=True, cache_dir=cache, cache_bytes="1G",
                          trust_unchanged=True) as f:
        need_cache(f.model)
        second = {k: f.get_tensor(k) for k in f.offset_keys()}
        nonempty, _ = sizes(f.model)
        st = f.model.stats()
        assert st["memo_tensors"] == nonempty and st["bytes_hashed"] == 0
    assert sorted(first) == sorted(second)
    for k in first:
        assert first[k].tobytes() == second[k].tobytes()


def test_stats_keys_and_no_cache(sharded):
    with sluice.open(sharded) as m:
        load_all(m)
        st = m.stats()
        for k in CACHE_KEYS:
            assert k in st and isinstance(st[k], int), k
            assert st[k] == 0, k
        assert m.cache_warning is None


def test_an_unusable_cache_is_a_warning(settled, tmp_path):
    """A cache directory that cannot be made (a file is in the way) turns
    the cache off for the model: loads go on, verified."""
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    with sluice.open(settled, cache_dir=blocker / "cache", trust_unchanged=True) as m:
        need_cache(m)
        first = load_all(m)
        nonempty, total = sizes(m)
        w = m.cache_warning
        assert isinstance(w, str) and w
        st = m.stats()
        assert st["disk_degraded"] == 1
        assert st["memo_tensors"] == 0 and st["bytes_hashed"] == total
        assert st["tensors_verified"] == nonempty
    assert len(first) == len(stfile.read_model(settled))


def test_cache_argument_checks(sharded, tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(sluice.InvalidArgumentError):
        sluice.open(sharded, cache_dir=cache, cache_bytes=0)
    with pytest.raises(sluice.InvalidArgumentError):
        sluice.open(sharded, cache_dir=cache, cache_bytes=0, trust_unchanged=True)
    with pytest.raises(ValueError):
        sluice.open(sharded, cache_dir=cache, cache_bytes=-1)
    with pytest.raises(ValueError):
        sluice.open(sharded, cache_dir=cache, cache_bytes=1 << 64)
    with pytest.raises(TypeError):
        sluice.open(sharded, cache_dir=cache, cache_bytes=1.5)
    with pytest.raises(TypeError):
        sluice.open(sharded, trust_unchanged=1)
    with pytest.raises(TypeError):
        sluice.open(sharded, cache_dir=5)
    with pytest.raises(ValueError):  # an embedded NUL
        sluice.open(sharded, cache_dir="a\0b")
    with sluice.open(sharded, cache_dir=pathlib.Path(cache), cache_bytes="1M",
                     trust_unchanged=True) as m:
        assert len(m) == 18
    with sluice.open(sharded, cache_dir=cache.encode(), cache_bytes=4096) as m:
        assert len(m) == 18


def test_cache_refuses_an_empty_directory_name(tmp_path, monkeypatch):
    # "" is not None: the library takes an empty name for the default
    # directory, so Cache("").clear() (a variable left empty) cleared the
    # user's default cache
    if not sluice.features()["cache"]:
        pytest.skip("this build has no SQLite")
    default = tmp_path / "default"
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(default))
    with sluice.Cache() as c:
        assert c.path == str(default)
    for empty in ("", b""):
        with pytest.raises(ValueError):
            sluice.Cache(empty)
