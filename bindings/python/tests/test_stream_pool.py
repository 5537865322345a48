"""Model.stream with a pool of a few tensors: a consumer that drops each
tensor before it takes the next never gets PoolExhaustedError once the
pool holds 2 of the largest tensors (the tensor it holds and the one the
stream delivers next): the binding hands a tensor over only when the
consumer takes it, so it holds none the consumer has not taken."""
import numpy as np
import pytest

import sluice
import stfile

N = 24
SIZE = 16 << 10  # 16 KiB tensors


@pytest.fixture
def small_tensors(tmp_path):
    path = str(tmp_path / "small.safetensors")
    tensors = {"t%02d" % i: np.full(SIZE, i, dtype=np.uint8) for i in range(N)}
    stfile.write_manifest(path + ".manifest.json", stfile.write(path, tensors))
    return path


@pytest.mark.parametrize("pool", [2 * SIZE, 64 << 10])
def test_stream_dropping_each_tensor_fits_two(small_tensors, pool):
    for _ in range(3):  # a few passes: a failure would show as a race too
        with sluice.open(small_tensors, pool=pool, queue_depth=4) as m:
            seen = []
            for name, a in m.stream():
                assert a.nbytes == SIZE and int(a[0]) == int(name[1:]) and int(a[-1]) == int(name[1:])
                seen.append(name)
                del a  # dropped before the next is taken
            assert sorted(seen) == ["t%02d" % i for i in range(N)]
            assert m.stats()["failures"] == 0
