"""Regenerate (or check) ``ignition/core/core_pb2.py`` from ``core.proto``.

    python -m ignition.core.generate            # regenerate with an old-enough protoc
    python -m ignition.core.generate --check    # committed file vs core.proto (no protoc needed)

Generation needs a protoc from 3.20 to 25.x (see the package docstring: newer gencode refuses protobuf
runtimes older than itself). It is found, in this order: ``--protoc CMD``; the ``FLARE_PROTOC`` environment
variable (a command line; the tests use it too); ``grpc_tools.protoc`` importable
in this interpreter; ``protoc`` on PATH. None of them is a project dependency; a throwaway one::

    python3 -m venv /tmp/protoc-venv && /tmp/protoc-venv/bin/pip install grpcio-tools==1.51.3   # libprotoc 3.21.6
    python -m ignition.core.generate --protoc "/tmp/protoc-venv/bin/python -m grpc_tools.protoc"

``python ignition/core/generate.py`` (as a script) works even when the committed core_pb2.py is broken.
After generating, the new file is checked like ``--check`` does, and must carry no runtime version check.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
PROTO = HERE / "core.proto"
PROTO_NAME = "ignition/core/core.proto"  # the name registered in the descriptor pool
GENERATED = HERE / "core_pb2.py"
NEWEST_PROTOC_MAJOR = 25  # gencode of protoc >= 26 calls ValidateProtobufRuntimeVersion


def find_protoc(explicit: str | None = None) -> list[str] | None:
    explicit = explicit or os.environ.get("FLARE_PROTOC")
    if explicit:
        return shlex.split(explicit)
    if importlib.util.find_spec("grpc_tools") is not None:
        return [sys.executable, "-m", "grpc_tools.protoc"]
    found = shutil.which("protoc")
    return [found] if found else None


def protoc_version(cmd: list[str]) -> tuple[int, int]:
    out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    m = re.search(r"(\d+)\.(\d+)", out)
    if not m:
        raise RuntimeError(f"cannot read a version from {out!r}")
    major, minor = int(m.group(1)), int(m.group(2))
    return (minor, 0) if major == 3 else (major, minor)  # libprotoc 3.21.6 is release 21


def protoc_descriptor(cmd: list[str]) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        subprocess.run([*cmd, "-I", str(REPO_ROOT), f"--descriptor_set_out={out}", PROTO_NAME], check=True)
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fdp,) = fds.file

    def strip(messages):  # --descriptor_set_out adds json_name; the Python gencode embeds none
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(fdp.message_type)
    return fdp


def embedded_descriptor(source: str) -> descriptor_pb2.FileDescriptorProto:
    """The FileDescriptorProto serialized in generated ``source``, read without importing the module."""
    m = re.search(r"AddSerializedFile\((b'(?:[^'\\]|\\.)*')\)", source)
    if not m:
        raise RuntimeError("no AddSerializedFile(...) in the generated file")
    import ast

    return descriptor_pb2.FileDescriptorProto.FromString(ast.literal_eval(m.group(1)))


def parsed_descriptor(text: str | None = None) -> descriptor_pb2.FileDescriptorProto:
    # loaded by path, so the script runs even while the package (which imports core_pb2) cannot be imported
    spec = importlib.util.spec_from_file_location("_flare_core_protoparse", HERE / "protoparse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_proto(PROTO.read_text() if text is None else text, PROTO_NAME)


def diff(a, b, a_name: str, b_name: str) -> str:
    return "".join(difflib.unified_diff(str(a).splitlines(True), str(b).splitlines(True), a_name, b_name))


def check(source: str | None = None) -> list[str]:
    """Problems with the generated source (default: the committed file); empty when it matches core.proto."""
    source = GENERATED.read_text() if source is None else source
    problems = []
    if "_runtime_version" in source or "ValidateProtobufRuntimeVersion" in source:
        problems.append(f"core_pb2.py carries a runtime version check (protoc > {NEWEST_PROTOC_MAJOR}.x); "
                        "it would refuse older protobuf runtimes")
    embedded, parsed = embedded_descriptor(source), parsed_descriptor()
    if embedded != parsed:
        problems.append("core_pb2.py does not match core.proto; run python -m ignition.core.generate\n"
                        + diff(parsed, embedded, "core.proto", "core_pb2.py"))
    return problems


def generate(protoc: list[str], allow_new: bool = False) -> str:
    version = protoc_version(protoc)
    if version[0] > NEWEST_PROTOC_MAJOR and not allow_new:
        raise SystemExit(f"protoc release {version[0]}.{version[1]} is newer than {NEWEST_PROTOC_MAJOR}.x: its "
                         "gencode refuses older protobuf runtimes (see --help for getting an old one)")
    if version[0] < 20:
        raise SystemExit(f"protoc release {version[0]} predates the builder gencode (3.20)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*protoc, "-I", str(REPO_ROOT), f"--python_out={tmp}", PROTO_NAME], check=True)
        return (Path(tmp) / "ignition/core/core_pb2.py").read_text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="check the committed core_pb2.py against core.proto")
    ap.add_argument("--protoc", help="protoc command line (e.g. 'python -m grpc_tools.protoc')")
    ap.add_argument("--allow-new-protoc", action="store_true", help="accept gencode with a runtime version check")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        protoc = find_protoc(args.protoc)
        if protoc is not None:
            ours, theirs = embedded_descriptor(GENERATED.read_text()), protoc_descriptor(protoc)
            if ours != theirs:
                problems.append("core_pb2.py differs from protoc's descriptor of core.proto\n"
                                + diff(theirs, ours, "protoc", "core_pb2.py"))
        for p in problems:
            print(p, file=sys.stderr)
        print("core_pb2.py matches core.proto" if not problems else "core_pb2.py is out of date")
        return 1 if problems else 0
    protoc = find_protoc(args.protoc)
    if protoc is None:
        raise SystemExit("no protoc found: pass --protoc or set FLARE_PROTOC (grpcio-tools<=1.62 in a throwaway venv "
                         "has one; see --help)")
    source = generate(protoc, args.allow_new_protoc)
    problems = [p for p in check(source) if args.allow_new_protoc is False or "runtime version" not in p]
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 1
    GENERATED.write_text(source)
    print(f"wrote {GENERATED.relative_to(REPO_ROOT)} ({len(source)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
