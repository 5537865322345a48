"""Checks that src/ asks a source's kind in one place only (issue 29 item 1,
docs/layout.md "index"): sl_is_remote is called only inside remote.c (a
location's kind is the one sluice_open parsed, base/location.h, and its
source table sl_source_of's), and a file's remote fields (url,
fetch_loc) are read only by the remote source (source_remote.c) and by
remote.c. Everything else calls the file's table (f->src) or tests a
capability (SL_SRC_*). A new kind is a new table, not new branches.
usage: check_sources.py SRC_DIR     (exit 1 with each violation)
"""
import os
import re
import sys

ALLOWED_KIND_TEST = {"remote.c", "remote.h"}
ALLOWED_REMOTE_FIELDS = {"remote.c", "remote.h", "source_remote.c", "index.h", "io.h"}
# index.h declares the fields; manifest.c names a sidecar from the
# location as given (fetch_loc), a string, not a kind test.
FIELD_READERS_OK = {"manifest.c": {"fetch_loc"}}


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def main(src):
    bad = []
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(src) for n in names)
    for path in paths:
        name = os.path.basename(path)
        if not name.endswith((".c", ".h")):
            continue
        with open(path, encoding="utf-8") as fh:
            lines = strip_comments(fh.read()).split("\n")
        for no, line in enumerate(lines, 1):
            if "sl_is_remote(" in line and name not in ALLOWED_KIND_TEST:
                bad.append(f"{name}:{no}: asks the kind (sl_is_remote): call the source's "
                           f"table or test a capability: {line.strip()}")
            for field in ("url", "fetch_loc"):
                if name in ALLOWED_REMOTE_FIELDS or field in FIELD_READERS_OK.get(name, ()):
                    continue
                if re.search(r"(->|\.)" + field + r"\b", line):
                    bad.append(f"{name}:{no}: reads a remote source's field {field}: "
                               f"{line.strip()}")
            if "any_remote" in line:
                bad.append(f"{name}:{no}: any_remote: use ix->caps_any / caps_lacking: "
                           f"{line.strip()}")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
