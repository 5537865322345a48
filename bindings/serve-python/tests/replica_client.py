"""One client process of test_replicas.py: streams MODEL from the replica
set ADDRS (a comma-separated list) REPEAT times, every tensor checked
against the trusted MANIFEST by the client; after its first tensor it
prints "stalling" and stops reading for STALL seconds (its call then held
open on one replica), or with GO_FILE until that file exists (at most
STALL seconds: the test ends the stall when it is ready, not at a time
guessed to outlast its own work). Prints "ok TENSORS FAILOVERS"; failovers
are logged on stderr.
usage: replica_client.py ADDRS MODEL MANIFEST REPEAT STALL [GO_FILE]"""
import os
import sys
import time

from sluice_serve import Client


def main():
    addrs, model, manifest, repeat, stall = sys.argv[1:6]
    go = sys.argv[6] if len(sys.argv) > 6 else None
    stall, n = float(stall), 0
    with Client(addrs, manifest=manifest) as c:
        for _ in range(int(repeat)):
            for _name, _data in c.stream(model, raw=True):
                n += 1
                if stall:
                    print("stalling", flush=True)
                    end = time.monotonic() + stall
                    if not go:
                        time.sleep(stall)
                    while go and time.monotonic() < end and not os.path.exists(go):
                        time.sleep(0.02)
                    stall = 0
        print("ok %d %d" % (n, c.failovers_used), flush=True)


if __name__ == "__main__":
    main()
