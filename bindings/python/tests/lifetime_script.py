"""Lifetime scenarios, run in-process by test_lifetime.py and again in a
fresh interpreter under -X dev and under AddressSanitizer. Exits 0 when
every scenario checked out; any use after free is ASan's to report.

usage: python lifetime_script.py MODEL_DIR
"""
import gc
import itertools
import sys
import threading
import time

import numpy as np

import sluice


def values(m, names):
    return {n: m.get_tensor(n, raw=True) for n in names}


def touch(live):
    for v in live.values():
        if isinstance(v, np.ndarray):
            v.sum()


def main(path):
    with sluice.open(path) as m:
        names = m.keys()
        ref = {n: m.get_tensor(n, raw=True).copy() for n in names}

    # 1. arrays outlive close(): the memory stays, the library closes after
    m = sluice.open(path)
    arrs = values(m, names)
    core = m._m
    m.close()
    assert core.open_in_library and core.live_handles == len(names)
    gc.collect()
    for n in names:
        assert arrs[n].tobytes() == ref[n].tobytes()
    arrs.clear()
    assert not core.open_in_library
    del core

    # 2. the model garbage-collected with live arrays (never closed)
    m = sluice.open(path)
    a = m.get_tensor(names[0], raw=True)
    b = m[names[1]]
    del m
    gc.collect()
    assert a.tobytes() == ref[names[0]].tobytes() and b.tobytes() == ref[names[1]].tobytes()
    del a, b
    gc.collect()

    # 3. del in every order: model, two arrays, a view, a stream iterator
    objs = ["model", "a", "b", "view", "stream"]
    for order in itertools.permutations(objs):
        m = sluice.open(path)
        live = {"model": m, "a": m.get_tensor(names[0], raw=True),
                "b": m.get_tensor(names[-1], raw=True)}
        live["view"] = live["a"][..., :1]
        it = m.stream(raw=True)
        next(it)
        live["stream"] = it
        core = m._m
        del m, it
        for k in order:
            if k == "model" and order.index("model") % 2:
                live["model"].close()
            del live[k]
            touch(live)  # what is left is still good
        gc.collect()
        # Our reference keeps the core object: close it, which closes the
        # library's model at once only when no handle is left anywhere.
        core.close()
        assert not core.open_in_library and core.live_handles == 0, order
        del core

    # 4. a stream abandoned midway, with its last array kept past close
    m = sluice.open(path, pool="1M")
    it = m.stream(raw=True)
    name, kept = next(it)
    it.close()
    m.close()
    assert kept.tobytes() == ref[name].tobytes()
    del kept, it, m

    # 5. threads acquiring while another thread closes
    for _ in range(5):
        m = sluice.open(path)
        out = []

        def worker():
            for n in names:
                try:
                    out.append(m.get_tensor(n, raw=True))
                except sluice.ClosedError:
                    return
        ts = [threading.Thread(target=worker) for _ in range(4)]
        for t in ts:
            t.start()
        m.close()
        for t in ts:
            t.join()
        touch(dict(enumerate(out)))
        core = m._m
        del out, m
        gc.collect()
        assert not core.open_in_library
        del core

    # 6. a stream stopped by one thread (Stream.close) while another takes
    #    its items, the model closed meanwhile: every item taken stays good,
    #    none is given back twice, and the model closes after the last one
    for k in range(20):
        m = sluice.open(path)
        core = m._m
        cs = core.stream(None)
        taken, errors = [], []

        def consume():
            try:
                while True:
                    item = cs.next_item()
                    if item is None:
                        return
                    taken.append(item)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        t = threading.Thread(target=consume)
        t.start()
        if k % 2:
            time.sleep(0.0002 * k)
        cs.close()
        m.close()
        t.join()
        assert not errors, errors
        h = None
        for i, h, code, _msg, info in taken:
            assert code == 0 and bytes(h) == ref[info[0]].tobytes() and info[7] == i
        assert cs.next_item() is None
        del taken, h, cs, m
        gc.collect()
        assert not core.open_in_library and core.live_handles == 0, k
        del core

    # 7. torch tensors keep the handle too (when torch is here)
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        m = sluice.open(path)
        t = m.get_tensor(names[0], framework="pt")
        core = m._m
        m.close()
        del m
        gc.collect()
        assert core.open_in_library
        assert t.numpy().tobytes() == ref[names[0]].tobytes()
        del t
        gc.collect()
        assert not core.open_in_library
    print("lifetimes ok")


if __name__ == "__main__":
    main(sys.argv[1])
