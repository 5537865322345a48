"""A model with nothing to check it against is loud in Python too:
sluice.UnverifiedWarning from sluice.open and everything built on it,
attributed to the caller's own line, once per model location; none with a
manifest or with verify="off"; an error when the caller's filter says so
(and the model is closed, not leaked)."""
import os
import warnings

import numpy as np
import pytest

import sluice
import stfile


def _model(directory, manifest):
    os.makedirs(directory, exist_ok=True)
    path = str(directory / "m.safetensors")
    digests = stfile.write(path, {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                                  "b": np.ones(4, dtype=np.float32)})
    if manifest:
        stfile.write_manifest(path + ".manifest.json", digests)
    return path


def _unverified(record):
    return [w for w in record if issubclass(w.category, sluice.UnverifiedWarning)]


def test_open_warns_with_where_it_looked(tmp_path):
    path = _model(tmp_path, manifest=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with sluice.open(path) as m:
            assert m.verify_state == "no_manifest"
            np.testing.assert_array_equal(m.get_tensor("b"), np.ones(4, dtype=np.float32))
    got = _unverified(record)
    assert len(got) == 1, [str(w.message) for w in record]
    assert path + ".manifest.json" in str(got[0].message)
    assert got[0].filename == __file__  # the caller's line, not sluice's
    assert issubclass(sluice.UnverifiedWarning, UserWarning)


def test_no_warning_when_verified_or_off(tmp_path):
    path = _model(tmp_path, manifest=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with sluice.open(path) as m:
            assert m.verify_state == "verified"
        with sluice.open(path, verify="off") as m:
            assert m.verify_state == "off"
        bare = _model(tmp_path / "x", False)
        with sluice.open(bare, verify="off") as m:  # the caller's own choice
            assert m.verify_state == "off"
    assert _unverified(record) == []


def test_once_per_model_with_the_default_filter(tmp_path):
    a = _model(tmp_path, manifest=False)
    b = _model(tmp_path / "other", manifest=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")
        for _ in range(3):
            for path in (a, b):
                sluice.open(path).close()
    assert len(_unverified(record)) == 2


def test_every_entry_point_warns_at_the_callers_line(tmp_path):
    path = _model(tmp_path, manifest=False)
    calls = [
        ("safe_open", lambda: sluice.safe_open(path, framework="np").__enter__().keys()),
        ("load_file", lambda: sluice.load_file(path)),
    ]
    try:
        import torch  # noqa: F401
        import sluice.torch as st
        import sluice.shard as sh

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.zeros(3, 4))
                self.b = torch.nn.Parameter(torch.zeros(4))

        calls += [
            ("load_shard", lambda: sh.load_shard(path, 0, 1)),
            ("iter_weights", lambda: list(st.iter_weights(path))),
            ("load_state_dict", lambda: st.load_state_dict(Net(), path)),
            ("lazy_load", lambda: st.lazy_load(Net(), path)),
        ]
    except ImportError:
        pass
    for what, call in calls:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call()
        got = _unverified(record)
        assert len(got) == 1, (what, [str(w.message) for w in record])
        assert got[0].filename == __file__, (what, got[0].filename)


def test_an_error_when_the_filter_says_so(tmp_path):
    path = _model(tmp_path, manifest=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sluice.UnverifiedWarning)
        with pytest.raises(sluice.UnverifiedWarning):
            sluice.open(path)
        with pytest.raises(sluice.UnverifiedWarning):
            sluice.load_file(path)
        ok = _model(tmp_path / "ok", True)
        with sluice.open(ok) as m:  # verified: no warning, so no error
            assert m.verify_state == "verified"


def _entry_points(path):
    """Every entry point that opens a model, each as a call of path."""
    calls = [
        ("open", lambda: sluice.open(path).close()),
        ("safe_open", lambda: sluice.safe_open(path, framework="np").__enter__().keys()),
        ("load_file", lambda: sluice.load_file(path)),
    ]
    try:
        import torch
        import sluice.torch as st
        import sluice.shard as sh
    except ImportError:
        return calls

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3, 4))
            self.b = torch.nn.Parameter(torch.zeros(4))

    return calls + [
        ("torch.load_file", lambda: st.load_file(path)),
        ("load_shard", lambda: sh.load_shard(path, 0, 1)),
        ("iter_weights", lambda: list(st.iter_weights(path))),
        ("lazy_load", lambda: st.lazy_load(Net(), path)),
    ]


def test_each_entry_point_warns_once_per_model(tmp_path):
    """Issue 38, item 2: from each entry point, one warning per model under
    the default filter however often it loads it, and one per load under
    "always" (no entry point opens twice and warns twice)."""
    a = _model(tmp_path / "a", manifest=False)
    b = _model(tmp_path / "b", manifest=False)
    for what, call in _entry_points(a):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call()
        assert len(_unverified(record)) == 1, (what, [str(w.message) for w in record])
    for (what, call_a), (_, call_b) in zip(_entry_points(a), _entry_points(b)):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("default")
            for _ in range(3):
                call_a()
                call_b()
        got = _unverified(record)
        assert len(got) == 2, (what, [str(w.message) for w in got])
        assert a + ".manifest.json" in str(got[0].message) or a in str(got[0].message)


def test_reopen_for_a_larger_pool_warns_once(tmp_path, monkeypatch):
    """safe_open and load_file reopen a model whose tensors do not fit the
    default pool with one that holds them: one load, one warning."""
    import sluice._safe_open as so
    path = _model(tmp_path, manifest=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sluice.open(path) as m:
            pool = m._m.stats()["pool_bytes"]
            total = sum(m._m.info(i)[3] + 64 for i in range(m._m.count()))
    monkeypatch.setattr(so, "_SLACK", pool - total + 1)  # one byte over: a reopen
    for what, call in (("safe_open", lambda: sluice.safe_open(path, framework="np")
                        .__enter__().keys()),
                       ("load_file", lambda: sluice.load_file(path))):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            call()
        assert len(_unverified(record)) == 1, (what, [str(w.message) for w in record])
