"""The committed core_pb2.py matches core.proto, and stays importable by old protobuf runtimes."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from ignition.core import core_pb2, generate
from ignition.core.protoparse import ProtoParseError, parse_proto


def test_committed_descriptor_equals_core_proto():
    """A small parser of core.proto builds protoc's FileDescriptorProto; it must equal the embedded one."""
    assert generate.check() == []
    assert generate.parsed_descriptor() == generate.embedded_descriptor(generate.GENERATED.read_text())


def test_descriptor_of_the_imported_module_is_the_committed_one():
    from google.protobuf import descriptor_pb2

    assert core_pb2.DESCRIPTOR.name == generate.PROTO_NAME and core_pb2.DESCRIPTOR.package == "flare.core"
    embedded = descriptor_pb2.FileDescriptorProto.FromString(core_pb2.DESCRIPTOR.serialized_pb)
    assert embedded == generate.parsed_descriptor()


@pytest.mark.parametrize("edit", [
    ("uint32 hidden_size = 3;", "uint32 hidden_size = 13;"),            # a renumbered field
    ("uint32 head_dim = 7;", "uint64 head_dim = 7;"),                   # a retyped field
    ("optional bool verified = 10;", "bool verified = 10;"),           # presence dropped
    ("  KV_PAGE_LAYOUT_HND = 2;", "  KV_PAGE_LAYOUT_HND = 2;\n  KV_PAGE_LAYOUT_X = 3;"),  # a new enum value
    ("string utc = 2;", "string utc = 2;\n  string host = 3;"),         # a new field
])
def test_check_catches_a_proto_edit_not_regenerated(edit):
    """Planted defect: core.proto edited without regenerating -> the check reports it."""
    text = generate.PROTO.read_text()
    assert edit[0] in text
    edited = generate.parsed_descriptor(text.replace(edit[0], edit[1], 1))
    assert edited != generate.embedded_descriptor(generate.GENERATED.read_text())


def test_check_catches_gencode_with_a_runtime_version_check():
    source = generate.GENERATED.read_text().replace(
        "from google.protobuf import descriptor as _descriptor",
        "from google.protobuf import runtime_version as _runtime_version\n"
        "from google.protobuf import descriptor as _descriptor", 1)
    assert any("runtime version check" in p for p in generate.check(source))


@pytest.mark.parametrize("text,match", [
    ('syntax = "proto2"; message A { optional int32 a = 1; }', "proto3"),
    ('syntax = "proto3"; import "x.proto";', "outside the subset"),
    ('syntax = "proto3"; message A { oneof o { int32 a = 1; } }', "outside the subset"),
    ('syntax = "proto3"; message A { int32 a = 1 [packed = false]; }', "field options"),
    ('syntax = "proto3"; message A { int32 a = 1; int32 b = 1; }', "field number 1 used by a and b"),
    ('syntax = "proto3"; message A { reserved 2; int32 a = 2; }', "reserved"),
    ('syntax = "proto3"; message A { Missing a = 1; }', "unknown type 'Missing'"),
])
def test_parser_rejects_what_it_does_not_model(text, match):
    with pytest.raises(ProtoParseError, match=match):
        parse_proto(text, "x.proto")


def test_gencode_imports_without_warnings():
    code = ("import warnings; warnings.simplefilter('error'); import ignition.core.core_pb2 as m; "
            "c = m.Core(format_version=1); assert m.Core.FromString(c.SerializeToString()) == c")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_protoc_descriptor_matches_when_protoc_is_available():
    protoc = generate.find_protoc()
    if protoc is None:
        pytest.skip("no protoc here (FLARE_PROTOC unset, grpc_tools not importable, no protoc on PATH); the "
                    "parser check above still compared core_pb2.py with core.proto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = generate.protoc_descriptor(protoc)
    assert theirs == generate.embedded_descriptor(generate.GENERATED.read_text())
