"""python -m sluice: the common subcommands of the `sluice` command, on the
Python package alone (no C build of the command needed):

  python -m sluice manifest PATH [-o FILE] [--v1 | --flat] [--chunk SIZE]
                            [--parts RULES [--worlds 2,4,8]] [--threads N]
                            [--sign-key KEY]
  python -m sluice verify PATH [--manifest FILE] [--key PUB] [--ca PEM]
                          [--signature FILE] [--files]
  python -m sluice ls PATH [--json]
  python -m sluice inspect PATH [--json] [--manifest FILE] [--key PUB] [--ca PEM]
                           [--signature FILE]
  python -m sluice cat PATH NAME [--manifest FILE] [--key PUB] [--ca PEM]

The manifest is written by the library's one writer (sluice.write_manifest,
the same as `sluice manifest`). Exit status, as the command's
(docs/command.md, "Exit status"): 0 success, 1 integrity (bytes or
headers that do not match the manifest), 2 usage (or a tensor name the
model lacks), 3 cannot open or read, 4 signature refused.
"""
import argparse
import json
import os
import sys

import sluice
from sluice import _errors

OK, INTEGRITY, USAGE, OPEN, SIGNATURE = 0, 1, 2, 3, 4


def exit_status(err):
    """The command's exit status of a sluice.Error (its class, as
    cmd_exit_status maps the C codes)."""
    if isinstance(err, (_errors.ChecksumError, _errors.ManifestMismatchError)):
        return INTEGRITY
    if isinstance(err, _errors.SignatureError):
        return SIGNATURE
    if isinstance(err, (_errors.InvalidArgumentError, _errors.NotFoundError)):
        return USAGE
    code = getattr(err, "code", None)
    if code in (_errors.E_MANIFEST_UNKNOWN, _errors.E_MANIFEST_MISSING):
        return INTEGRITY
    return OPEN


def _trust(args):
    kw = {}
    if getattr(args, "manifest", None):
        kw["manifest"] = args.manifest
    if getattr(args, "key", None):
        kw["trusted_keys"] = args.key
    if getattr(args, "ca", None):
        kw["trusted_cas"] = args.ca
    if getattr(args, "signature", None):
        kw["signature_path"] = args.signature
    return kw


def cmd_manifest(args):
    version = "flat" if args.flat else 1 if args.v1 else 2
    worlds = tuple(int(w) for w in args.worlds.split(",")) if args.worlds else (2, 4, 8)
    out = args.output
    if args.sign_key and out in (None, "-"):
        print("python -m sluice manifest: --sign-key needs -o FILE (the signature is "
              "FILE.sig beside it)", file=sys.stderr)
        return USAGE
    if out in (None, "-"):
        out = sys.stdout.fileno()
        sys.stdout.flush()
    try:
        sluice.write_manifest(args.path, out, version=version,
                              chunk=args.chunk if version == 2 else None,
                              parts=args.parts, worlds=worlds, threads=args.threads,
                              sign_key=args.sign_key)
    except _errors.SignatureError as e:  # no trust options here: only the signing key
        print(f"python -m sluice manifest: {e}", file=sys.stderr)
        return OPEN  # a key that cannot sign cannot be used, as `sluice manifest --sign-key`
    return OK


def cmd_verify(args):
    with sluice.open(args.path, verify="require", **_trust(args)) as m:
        print(f"manifest {m.manifest_path}")
        r = m.verify(files=args.files)
    for e in r["failures"]:
        print(f"FAILED {e.kind} {json.dumps(e.name) if e.kind == 'tensor' else e.name}: {e}")
    print(f"{r['tensors_ok']} tensors verified, {r['tensors_failed']} failed"
          + (f", {r['files_ok']} files verified, {r['files_failed']} failed" if args.files else ""))
    if not r["failures"]:
        return OK
    worst = [exit_status(e) for e in r["failures"]]
    return INTEGRITY if INTEGRITY in worst else worst[0]


def cmd_ls(args):
    with sluice.open(args.path, verify="off") as m:
        infos = [m.info(name) for name in m.keys()]
        if args.json:
            json.dump({"tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                                    "nbytes": t.nbytes, "file": t.file} for t in infos]},
                      sys.stdout, indent=1)
            print()
            return OK
        total = 0
        for t in infos:
            total += t.nbytes
            print(f"{json.dumps(t.name):48s} {t.dtype:8s} {str(list(t.shape)):22s} {t.nbytes:14d}")
        print(f"\ntotal: {len(infos)} tensors, {total} bytes")
    return OK


def _checked_against(m):
    """What a load's bytes are checked against, worded as `sluice inspect`
    and `sluice verify` word it."""
    state, where = m.verify_state, m.manifest_path
    if state == "verified":
        return f"manifest {where}"
    if state == "publisher_digest":
        return f"verified against the publisher's file digest (manifest {where})"
    if state == "no_manifest":
        return "not verified: no manifest found"
    return "not verified: verification is off"


def cmd_inspect(args):
    """The listing of ls, and what a load's bytes are checked against: the
    model opened as a load opens it (the manifest, its signature, a Hub
    snapshot's or hf:// model's publisher digest); a refused open says
    FAILED and why, lists the index from the headers alone, and exits with
    the refusal's status."""
    import warnings
    failed, status = None, OK
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sluice.UnverifiedWarning)  # said below
            m = sluice.open(args.path, **_trust(args))
    except _errors.Error as e:
        status = exit_status(e)
        if status == USAGE:
            raise
        failed = str(e)
        m = sluice.open(args.path, verify="off")
    with m:
        verification = f"FAILED: {failed}" if failed else _checked_against(m)
        infos = [m.info(name) for name in m.keys()]
        if args.json:
            json.dump({"verification": {"state": "failed" if failed else m.verify_state,
                                        "manifest": None if failed else m.manifest_path,
                                        "text": verification},
                       "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                                    "nbytes": t.nbytes, "file": t.file} for t in infos]},
                      sys.stdout, indent=1)
            print()
        else:
            print(f"verification: {verification}")
            total = 0
            for t in infos:
                total += t.nbytes
                print(f"{json.dumps(t.name):48s} {t.dtype:8s} {str(list(t.shape)):22s} "
                      f"{t.nbytes:14d}")
            print(f"\ntotal: {len(infos)} tensors, {total} bytes")
    if failed:
        print(f"python -m sluice inspect: {failed}", file=sys.stderr)
    return status


def cmd_cat(args):
    with sluice.open(args.path, verify="if_present", **_trust(args)) as m:
        if args.name not in m:
            print(f"python -m sluice cat: {json.dumps(args.name)}: no such tensor in {args.path}",
                  file=sys.stderr)
            return USAGE
        data = m.get_tensor(args.name, framework="np").tobytes()
    out = sys.stdout.buffer
    out.write(data)
    out.flush()
    return OK


def parser():
    p = argparse.ArgumentParser(prog="python -m sluice", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Exit status: 0 success, 1 integrity, 2 usage, "
                                       "3 cannot open or read, 4 signature refused.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("manifest", help="write the manifest of a model")
    m.add_argument("path")
    m.add_argument("-o", "--output", help="the file (default: stdout; the sidecar is "
                   "F.manifest.json beside a file F, sluice.manifest.json in a directory)")
    form = m.add_mutually_exclusive_group()
    form.add_argument("--v1", action="store_true", help="version 1")
    form.add_argument("--flat", action="store_true", help='{"tensor": "SHA-256"} only')
    m.add_argument("--chunk", default="16M", help="version 2: chunk digests (default 16M; 0: none)")
    m.add_argument("--parts", help="version 2: a rules file, or builtin")
    m.add_argument("--worlds", help="the world sizes of --parts (default 2,4,8)")
    m.add_argument("--threads", type=int, help="hashing threads (default: every CPU)")
    m.add_argument("--sign-key", metavar="KEY", help="sign the manifest with this Ed25519 "
                   "private key (as 'sluice sign' does) into FILE.sig; needs -o FILE")
    m.set_defaults(run=cmd_manifest)
    for name, run, what in (("verify", cmd_verify, "check every tensor against the manifest"),
                            ("cat", cmd_cat, "write one tensor's verified bytes to stdout")):
        c = sub.add_parser(name, help=what)
        c.add_argument("path")
        if name == "cat":
            c.add_argument("name")
        else:
            c.add_argument("--files", action="store_true", help="also every whole file")
        c.add_argument("-m", "--manifest", help="the manifest (default: the sidecar)")
        c.add_argument("--key", action="append", help="a trusted public key (repeatable)")
        c.add_argument("--ca", action="append", help="a trusted CA certificate (repeatable)")
        c.add_argument("--signature", help="the OpenSSF model-signing bundle")
        c.set_defaults(run=run)
    c = sub.add_parser("ls", help="list a model's tensors (headers only, nothing checked)")
    c.add_argument("path")
    c.add_argument("--json", action="store_true")
    c.set_defaults(run=cmd_ls)
    c = sub.add_parser("inspect", help="list a model's tensors and say what a load's bytes "
                       "are checked against (opened as a load opens it)")
    c.add_argument("path")
    c.add_argument("--json", action="store_true")
    c.add_argument("-m", "--manifest", help="the manifest (default: the sidecar)")
    c.add_argument("--key", action="append", help="a trusted public key (repeatable)")
    c.add_argument("--ca", action="append", help="a trusted CA certificate (repeatable)")
    c.add_argument("--signature", help="the OpenSSF model-signing bundle")
    c.set_defaults(run=cmd_inspect)
    return p


def main(argv=None):
    args = parser().parse_args(argv)  # usage errors exit 2
    try:
        return args.run(args)
    except _errors.Error as e:
        print(f"python -m sluice {args.command}: {e}", file=sys.stderr)
        return exit_status(e)
    except OSError as e:
        print(f"python -m sluice {args.command}: {e}", file=sys.stderr)
        return OPEN
    except ValueError as e:
        print(f"python -m sluice {args.command}: {e}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "default")
    sys.exit(main())
