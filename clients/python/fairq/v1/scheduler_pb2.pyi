from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "stop", "seed", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "messages", "prompt_token_ids", "sampling", "tier", "request_id", "extra")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    messages: ChatMessages
    prompt_token_ids: TokenIds
    sampling: SamplingParams
    tier: str
    request_id: str
    extra: _struct_pb2.Struct
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., tier: _Optional[str] = ..., request_id: _Optional[str] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class Started(_message.Message):
    __slots__ = ("backend_id", "queue_seconds", "tier", "request_id")
    BACKEND_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    backend_id: str
    queue_seconds: float
    tier: str
    request_id: str
    def __init__(self, backend_id: _Optional[str] = ..., queue_seconds: _Optional[float] = ..., tier: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("text", "extra")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    text: str
    extra: _struct_pb2.Struct
    def __init__(self, text: _Optional[str] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_seconds", "ttft_seconds", "total_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    ttft_seconds: float
    total_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., ttft_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("finish_reason", "usage", "timings")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    usage: Usage
    timings: Timings
    def __init__(self, finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("queued", "started", "chunk", "finished")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    queued: Queued
    started: Started
    chunk: Chunk
    finished: Finished
    def __init__(self, queued: _Optional[_Union[Queued, _Mapping]] = ..., started: _Optional[_Union[Started, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...
