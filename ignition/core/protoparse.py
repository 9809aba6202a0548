"""A small parser for the proto3 subset ``core.proto`` uses, producing the ``FileDescriptorProto`` protoc would.

It exists so the committed ``core_pb2.py`` can be checked against ``core.proto`` on any machine, with no
protoc installed: ``parse_proto(text, name) == FileDescriptorProto.FromString(core_pb2.DESCRIPTOR.serialized_pb)``
(``tests/core/test_codegen.py``, ``python -m ignition.core.generate --check``).

Supported: ``syntax``, ``package``, ``message`` (nested messages and enums), ``enum``, scalar / message / enum
fields with ``repeated`` or proto3 ``optional`` (a synthetic oneof ``_name``, as protoc emits), ``map<K, V>``
(a nested ``XxxEntry`` message with ``map_entry``), ``reserved`` numbers, ranges and names, and comments.
Anything else (imports, options, oneofs, services, groups, field options, proto2) raises ``ProtoParseError``,
so an edit of core.proto beyond this subset fails the check loudly instead of being compared wrongly.
"""

from __future__ import annotations

import re

from google.protobuf import descriptor_pb2

F = descriptor_pb2.FieldDescriptorProto

SCALARS = {
    "double": F.TYPE_DOUBLE, "float": F.TYPE_FLOAT, "int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64,
    "int32": F.TYPE_INT32, "fixed64": F.TYPE_FIXED64, "fixed32": F.TYPE_FIXED32, "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES, "uint32": F.TYPE_UINT32, "sfixed32": F.TYPE_SFIXED32,
    "sfixed64": F.TYPE_SFIXED64, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64,
}
_MAX_FIELD = 536870911

_TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<line>//[^\n]*) | (?P<block>/\*.*?\*/)
  | (?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<num>-?(?:0[xX][0-9a-fA-F]+|\d+))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<sym>[{}\[\]()<>;=,])
""", re.VERBOSE | re.DOTALL)


class ProtoParseError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            line = text.count("\n", 0, pos) + 1
            raise ProtoParseError(f"line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind not in ("ws", "line", "block"):
            out.append((kind, m.group(), text.count("\n", 0, pos) + 1))
        pos = m.end()
    return out


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def next(self) -> str:
        if self.i >= len(self.toks):
            raise ProtoParseError("unexpected end of file")
        tok = self.toks[self.i]
        self.i += 1
        return tok[1]

    def fail(self, message: str):
        line = self.toks[min(self.i, len(self.toks) - 1)][2] if self.toks else 0
        raise ProtoParseError(f"line {line}: {message}")

    def expect(self, value: str):
        tok = self.next()
        if tok != value:
            self.i -= 1
            self.fail(f"expected {value!r}, got {tok!r}")

    def ident(self) -> str:
        kind, value, _ = self.toks[self.i] if self.i < len(self.toks) else ("eof", "", 0)
        if kind != "ident":
            self.fail(f"expected a name, got {value!r}")
        self.i += 1
        return value

    def number(self) -> int:
        kind, value, _ = self.toks[self.i] if self.i < len(self.toks) else ("eof", "", 0)
        if kind != "num":
            self.fail(f"expected a number, got {value!r}")
        self.i += 1
        return int(value, 0)

    def string(self) -> str:
        kind, value, _ = self.toks[self.i] if self.i < len(self.toks) else ("eof", "", 0)
        if kind != "str":
            self.fail(f"expected a string, got {value!r}")
        self.i += 1
        return value[1:-1]

    # -- grammar -----------------------------------------------------------------------------------
    def file(self, name: str) -> descriptor_pb2.FileDescriptorProto:
        fdp = descriptor_pb2.FileDescriptorProto(name=name)
        syntax = None
        while self.peek() is not None:
            word = self.ident()
            if word == "syntax":
                self.expect("=")
                syntax = self.string()
                self.expect(";")
            elif word == "package":
                fdp.package = self.ident()
                self.expect(";")
            elif word == "message":
                self.message(fdp.message_type.add())
            elif word == "enum":
                self.enum(fdp.enum_type.add())
            else:
                self.i -= 1
                self.fail(f"{word!r} is outside the subset this checker parses")
        if syntax != "proto3":
            raise ProtoParseError(f"only syntax = \"proto3\" is supported, got {syntax!r}")
        fdp.syntax = "proto3"
        return fdp

    def enum(self, e: descriptor_pb2.EnumDescriptorProto):
        e.name = self.ident()
        self.expect("{")
        while self.peek() != "}":
            v = e.value.add()
            v.name = self.ident()
            self.expect("=")
            v.number = self.number()
            self.expect(";")
        self.expect("}")
        if not e.value or e.value[0].number != 0:
            raise ProtoParseError(f"enum {e.name}: the first value must be 0 in proto3")

    def message(self, m: descriptor_pb2.DescriptorProto):
        m.name = self.ident()
        self.expect("{")
        synthetic: list[str] = []
        while self.peek() != "}":
            word = self.ident()
            if word == "message":
                self.message(m.nested_type.add())
            elif word == "enum":
                self.enum(m.enum_type.add())
            elif word == "reserved":
                self.reserved(m)
            elif word == "map":
                self.map_field(m)
            elif word in ("oneof", "option", "extensions", "extend", "group", "required"):
                self.i -= 1
                self.fail(f"{word!r} is outside the subset this checker parses")
            else:
                label = F.LABEL_OPTIONAL
                proto3_optional = False
                if word == "repeated":
                    label = F.LABEL_REPEATED
                    word = self.ident()
                elif word == "optional":
                    proto3_optional = True
                    word = self.ident()
                f = m.field.add()
                f.label = label
                self.field_type(f, word)
                f.name = self.ident()
                self.expect("=")
                f.number = self.number()
                if self.peek() == "[":
                    self.fail(f"field options on {f.name!r} are outside the subset this checker parses")
                self.expect(";")
                if proto3_optional:
                    f.proto3_optional = True
                    synthetic.append(f)
        self.expect("}")
        # protoc appends synthetic oneofs after any real ones, in field order.
        for f in synthetic:
            f.oneof_index = len(m.oneof_decl)
            m.oneof_decl.add(name="_" + f.name)

    def reserved(self, m: descriptor_pb2.DescriptorProto):
        while True:
            if self.toks[self.i][0] == "str":
                m.reserved_name.append(self.string())
            else:
                start = self.number()
                end = start
                if self.peek() == "to":
                    self.next()
                    end = _MAX_FIELD if self.peek() == "max" and self.next() else self.number()
                m.reserved_range.add(start=start, end=end + 1)
            if self.peek() == ",":
                self.next()
                continue
            self.expect(";")
            return

    def field_type(self, f, word: str):
        if word in SCALARS:
            f.type = SCALARS[word]
        else:
            f.type_name = word  # resolved after the whole file is read
        return f

    def map_field(self, m: descriptor_pb2.DescriptorProto):
        self.expect("<")
        key = self.ident()
        self.expect(",")
        value = self.ident()
        self.expect(">")
        name = self.ident()
        self.expect("=")
        number = self.number()
        self.expect(";")
        if key not in SCALARS or key in ("double", "float", "bytes"):
            self.fail(f"map key type {key!r} is not allowed")
        entry = m.nested_type.add(name=_camel(name) + "Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=SCALARS[key])
        self.field_type(entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL), value)
        m.field.add(name=name, number=number, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE, type_name=entry.name)


def _resolve(fdp: descriptor_pb2.FileDescriptorProto):
    """Turn written type names into protoc's fully qualified ``.package.Outer.Inner`` and set the type."""
    kinds: dict[str, int] = {}
    pkg = "." + fdp.package if fdp.package else ""

    def collect(prefix, messages, enums):
        for e in enums:
            kinds[f"{prefix}.{e.name}"] = F.TYPE_ENUM
        for msg in messages:
            kinds[f"{prefix}.{msg.name}"] = F.TYPE_MESSAGE
            collect(f"{prefix}.{msg.name}", msg.nested_type, msg.enum_type)

    collect(pkg, fdp.message_type, fdp.enum_type)

    def visit(scope, messages):
        for msg in messages:
            inner = f"{scope}.{msg.name}"
            for f in msg.field:
                if not f.type_name or f.type_name.startswith("."):
                    continue
                written = f.type_name
                parts = inner.split(".")
                for n in range(len(parts), 0, -1):
                    candidate = ".".join(parts[:n]) + "." + written
                    if candidate in kinds:
                        break
                else:
                    candidate = "." + written
                if candidate not in kinds:
                    raise ProtoParseError(f"{inner[1:]}.{f.name}: unknown type {written!r}")
                f.type_name = candidate
                f.type = kinds[candidate]
            visit(inner, msg.nested_type)

    visit(pkg, fdp.message_type)


def _check_numbers(messages, scope=""):
    for msg in messages:
        seen: dict[int, str] = {}
        for f in msg.field:
            if not 1 <= f.number <= _MAX_FIELD or 19000 <= f.number <= 19999:
                raise ProtoParseError(f"{scope}{msg.name}.{f.name}: invalid field number {f.number}")
            if f.number in seen:
                raise ProtoParseError(f"{scope}{msg.name}: field number {f.number} used by {seen[f.number]} and "
                                      f"{f.name}")
            if any(r.start <= f.number < r.end for r in msg.reserved_range) or f.name in msg.reserved_name:
                raise ProtoParseError(f"{scope}{msg.name}.{f.name}: uses a reserved number or name")
            seen[f.number] = f.name
        _check_numbers(msg.nested_type, f"{scope}{msg.name}.")


def parse_proto(text: str, name: str) -> descriptor_pb2.FileDescriptorProto:
    """Parse proto3 ``text`` (the file registered as ``name``) into a ``FileDescriptorProto``."""
    fdp = _Parser(text).file(name)
    _resolve(fdp)
    _check_numbers(fdp.message_type)
    return fdp
