"""The gRPC contracts: stubs import, match the .proto files, and follow the lint style."""

from __future__ import annotations

import re

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

from protos import (
    common_pb2,
    generate,
    inference_pb2,
    inference_pb2_grpc,
    kv_transfer_pb2,
    orchestrator_pb2,
    orchestrator_pb2_grpc,
    retriever_pb2,
    retriever_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
)

FILES: list[FileDescriptor] = [
    common_pb2.DESCRIPTOR,
    inference_pb2.DESCRIPTOR,
    retriever_pb2.DESCRIPTOR,
    orchestrator_pb2.DESCRIPTOR,
    sessions_pb2.DESCRIPTOR,
    kv_transfer_pb2.DESCRIPTOR,
]

UPPER_SNAKE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
LOWER_SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
PASCAL = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def all_messages() -> list[Descriptor]:
    found = []

    def visit(message: Descriptor) -> None:
        if message.GetOptions().map_entry:
            return
        found.append(message)
        for nested in message.nested_types:
            visit(nested)

    for file in FILES:
        for message in file.message_types_by_name.values():
            visit(message)
    return found


def all_enums() -> list[EnumDescriptor]:
    enums = [enum for file in FILES for enum in file.enum_types_by_name.values()]
    enums += [enum for message in all_messages() for enum in message.enum_types]
    return enums


def upper_snake(pascal: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", pascal).upper()


def test_stubs_import_from_repo_root():
    assert inference_pb2_grpc.InferenceStub
    assert retriever_pb2_grpc.RetrieverStub
    assert retriever_pb2_grpc.CollectionsStub
    assert orchestrator_pb2_grpc.OrchestratorStub
    assert sessions_pb2_grpc.SessionsStub
    assert {file.package for file in FILES} == {"streamrag.v1"}
    services = {service.full_name for file in FILES for service in file.services_by_name.values()}
    assert services == {"streamrag.v1.Inference", "streamrag.v1.Retriever", "streamrag.v1.Orchestrator",
                        "streamrag.v1.Sessions", "streamrag.v1.Collections", "streamrag.v1.KvTransfer"}


def test_committed_stubs_match_the_proto_files():
    problems = generate.drift(generate.generate_stubs(), generate.committed_stubs())
    assert not problems, "\n".join(problems) + "\nrun: python -m protos.generate"


def test_every_enum_zero_value_is_unspecified_and_values_are_prefixed():
    enums = all_enums()
    assert enums
    for enum in enums:
        prefix = upper_snake(enum.name) + "_"
        assert enum.values_by_number[0].name == prefix + "UNSPECIFIED", enum.full_name
        for value in enum.values:
            assert value.name.startswith(prefix), value.name
            assert UPPER_SNAKE.match(value.name), value.name


def test_every_rpc_has_its_own_request_and_response_message():
    seen: list[str] = []
    for file in FILES:
        for service in file.services_by_name.values():
            for method in service.methods:
                for message, suffix in ((method.input_type, "Request"), (method.output_type, "Response")):
                    allowed = {method.name + suffix, service.name + method.name + suffix}
                    assert message.name in allowed, f"{service.name}.{method.name}: {message.name}"
                    seen.append(message.full_name)
    assert len(seen) == len(set(seen)), "a message is used by more than one RPC"


def test_names_follow_the_lint_style():
    for message in all_messages():
        assert PASCAL.match(message.name), message.full_name
        for field in message.fields:
            assert LOWER_SNAKE.match(field.name), field.full_name
        for oneof in message.oneofs:
            # "_x" is the synthetic oneof protoc adds for a proto3 `optional x` field.
            assert LOWER_SNAKE.match(oneof.name.removeprefix("_")), oneof.full_name


def documented_elements(file: descriptor_pb2.FileDescriptorProto):
    """Yields (source location path, name) of every element that needs a comment."""

    def enum_elements(enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...]):
        yield path, enum.name
        for i, value in enumerate(enum.value):
            yield (*path, 2, i), value.name

    def message_elements(message: descriptor_pb2.DescriptorProto, path: tuple[int, ...]):
        if message.options.map_entry:
            return
        yield path, message.name
        for i, field in enumerate(message.field):
            yield (*path, 2, i), f"{message.name}.{field.name}"
        for i, oneof in enumerate(message.oneof_decl):
            if not oneof.name.startswith("_"):  # "_x" is the synthetic oneof of `optional x`
                yield (*path, 8, i), f"{message.name}.{oneof.name}"
        for i, nested in enumerate(message.nested_type):
            yield from message_elements(nested, (*path, 3, i))
        for i, enum in enumerate(message.enum_type):
            yield from enum_elements(enum, (*path, 4, i))

    for i, message in enumerate(file.message_type):
        yield from message_elements(message, (4, i))
    for i, enum in enumerate(file.enum_type):
        yield from enum_elements(enum, (5, i))
    for i, service in enumerate(file.service):
        yield (6, i), service.name
        for j, method in enumerate(service.method):
            yield (6, i, 2, j), f"{service.name}.{method.name}"


def test_every_service_rpc_message_field_and_enum_is_commented():
    files = descriptor_pb2.FileDescriptorSet.FromString(generate.descriptor_set_with_comments())
    assert {file.name for file in files.file} == {file.name for file in FILES}
    missing = []
    for file in files.file:
        commented = {
            tuple(location.path) for location in file.source_code_info.location if location.leading_comments.strip()
        }
        missing += [f"{file.name}: {name}" for path, name in documented_elements(file) if path not in commented]
    assert not missing, "uncommented: " + ", ".join(missing)


def test_prompt_update_open_round_trips_text_and_token_segments():
    request = inference_pb2.StreamPromptRequest(
        update=inference_pb2.PromptUpdate(
            open=inference_pb2.PromptOpen(
                request_id="req-1",
                sampling=common_pb2.SamplingParams(temperature=0.7, max_tokens=32, seed=7, stop=["\n\n"]),
                priority=2,
                segments=[
                    common_pb2.Segment(text="You answer questions.\n"),
                    common_pb2.Segment(token_ids=common_pb2.TokenIds(ids=[1, 2, 3]), key="doc-9"),
                ],
            )
        )
    )
    parsed = inference_pb2.StreamPromptRequest.FromString(request.SerializeToString())

    assert parsed == request
    assert parsed.update.WhichOneof("kind") == "open"
    opened = parsed.update.open
    assert opened.HasField("priority") and opened.priority == 2
    assert opened.sampling.HasField("seed") and opened.sampling.temperature == 0.7
    assert [s.WhichOneof("content") for s in opened.segments] == ["text", "token_ids"]
    assert opened.segments[0].text == "You answer questions.\n"
    assert list(opened.segments[1].token_ids.ids) == [1, 2, 3]
    assert opened.segments[1].key == "doc-9"


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (common_pb2, ["Segment", "SamplingParams", "LifecycleEvent", "RequestStats", "Document"]),
        (inference_pb2, ["PromptUpdate", "InferenceEvent", "GenerateRequest", "ModelInfo", "EngineStats"]),
        (retriever_pb2, ["RetrieveRequest", "ContextChunk"]),
        (orchestrator_pb2, ["AskRequest", "AskEvent", "GetRequestRequest", "RequestRecord"]),
    ],
)
def test_design_named_messages_exist(module, names):
    for name in names:
        assert name in module.DESCRIPTOR.message_types_by_name, name
