"""One client process of test_replicas.py: streams MODEL from the replica
set ADDRS (a comma-separated list) REPEAT times, every tensor checked
against the trusted MANIFEST by the client; after its first tensor it
prints "stalling" and stops reading for STALL seconds (its call then held
open on one replica). Prints "ok TENSORS FAILOVERS"; failovers are logged
on stderr.
usage: replica_client.py ADDRS MODEL MANIFEST REPEAT STALL"""
import sys
import time

from sluice_serve import Client


def main():
    addrs, model, manifest, repeat, stall = sys.argv[1:]
    stall, n = float(stall), 0
    with Client(addrs, manifest=manifest) as c:
        for _ in range(int(repeat)):
            for _name, _data in c.stream(model, raw=True):
                n += 1
                if stall:
                    print("stalling", flush=True)
                    time.sleep(stall)
                    stall = 0
        print("ok %d %d" % (n, c.failovers_used), flush=True)


if __name__ == "__main__":
    main()
