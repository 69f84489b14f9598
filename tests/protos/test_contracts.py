"""Conventions of the .proto sources: everything documented, enums well-formed, reasons in step with the core."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import EnumDescriptor

from placement.reasons import Reason
from tandem.v1 import common_pb2
from tests.protos import cases

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tandem_protos_script", REPO_ROOT / "scripts" / "protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def source_files(tmp_path_factory: pytest.TempPathFactory) -> list[descriptor_pb2.FileDescriptorProto]:
    """The tandem.v1 files as descriptors with their comments (protoc --include_source_info)."""
    from grpc_tools import protoc

    protos = _load_script()
    out = tmp_path_factory.mktemp("descriptors") / "set.pb"
    args = [
        "protoc",
        *(f"--proto_path={p}" for p in protos.include_paths()),
        "--include_source_info",
        f"--descriptor_set_out={out}",
        *(f.as_posix() for f in protos.proto_files()),
    ]
    assert protoc.main(args) == 0
    return list(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file)


# Field numbers of the descriptor.proto fields that make up source-info paths.
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MSG_FIELD, _MSG_NESTED, _MSG_ENUM, _MSG_ONEOF = 2, 3, 4, 8
_ENUM_VALUE, _SERVICE_METHOD = 2, 2


def _elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(readable name, source path) of every message, field, oneof, enum, value, service and method."""

    def enum(
        e: descriptor_pb2.EnumDescriptorProto, name: str, path: tuple[int, ...]
    ) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield name, path
        for i, v in enumerate(e.value):
            yield f"{name}.{v.name}", (*path, _ENUM_VALUE, i)

    def message(
        m: descriptor_pb2.DescriptorProto, name: str, path: tuple[int, ...]
    ) -> Iterator[tuple[str, tuple[int, ...]]]:
        yield name, path
        for i, f in enumerate(m.field):
            yield f"{name}.{f.name}", (*path, _MSG_FIELD, i)
        for i, o in enumerate(m.oneof_decl):
            if not o.name.startswith("_"):  # synthetic oneofs of proto3 `optional`
                yield f"{name}.{o.name} (oneof)", (*path, _MSG_ONEOF, i)
        for i, n in enumerate(m.nested_type):
            if not n.options.map_entry:
                yield from message(n, f"{name}.{n.name}", (*path, _MSG_NESTED, i))
        for i, e in enumerate(m.enum_type):
            yield from enum(e, f"{name}.{e.name}", (*path, _MSG_ENUM, i))

    for i, m in enumerate(file.message_type):
        yield from message(m, m.name, (_FILE_MESSAGE, i))
    for i, e in enumerate(file.enum_type):
        yield from enum(e, e.name, (_FILE_ENUM, i))
    for i, s in enumerate(file.service):
        yield s.name, (_FILE_SERVICE, i)
        for k, method in enumerate(s.method):
            yield f"{s.name}.{method.name}", (_FILE_SERVICE, i, _SERVICE_METHOD, k)


def test_every_element_has_a_leading_comment(source_files: list[descriptor_pb2.FileDescriptorProto]) -> None:
    undocumented = []
    for file in source_files:
        comments = {tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location}
        undocumented += [f"{file.name}: {name}" for name, path in _elements(file) if not comments.get(path)]
    assert not undocumented, "elements without a leading // comment:\n" + "\n".join(undocumented)


def test_every_file_has_a_header_comment_and_the_v1_package(
    source_files: list[descriptor_pb2.FileDescriptorProto],
) -> None:
    syntax_path = (12,)  # FileDescriptorProto.syntax
    for file in source_files:
        assert file.package == "tandem.v1"
        assert file.syntax == "proto3"
        header = [loc for loc in file.source_code_info.location if tuple(loc.path) == syntax_path]
        assert header and (header[0].leading_comments or header[0].leading_detached_comments), (
            f"{file.name} lacks a header comment"
        )


def _all_enums() -> list[EnumDescriptor]:
    enums: list[EnumDescriptor] = []
    for module in cases.pb2_modules():
        enums.extend(module.DESCRIPTOR.enum_types_by_name.values())
    for desc in cases.all_message_descriptors():
        enums.extend(desc.enum_types)
    return enums


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


@pytest.mark.parametrize("enum", _all_enums(), ids=lambda e: e.name)
def test_enum_zero_is_unspecified_and_values_are_prefixed(enum: EnumDescriptor) -> None:
    prefix = _upper_snake(enum.name) + "_"
    assert enum.values_by_number[0].name == prefix + "UNSPECIFIED"
    assert all(v.name.startswith(prefix) for v in enum.values)
    assert len({v.number for v in enum.values}) == len(enum.values), "no aliases"


def test_fit_reason_mirrors_the_placement_reason_enum() -> None:
    """The extender/broker converters map placement.reasons.Reason to FitReason by name, one to one."""
    wire = set(common_pb2.FitReason.keys())
    missing = sorted(f"FIT_REASON_{r.name}" for r in Reason if f"FIT_REASON_{r.name}" not in wire)
    assert not missing, f"add these values to FitReason in protos/tandem/v1/common.proto: {missing}"


def test_no_field_is_named_after_a_python_keyword() -> None:
    import keyword

    clashes = [
        f"{d.full_name}.{f.name}"
        for d in cases.all_message_descriptors()
        for f in d.fields
        if keyword.iskeyword(f.name)
    ]
    assert not clashes
