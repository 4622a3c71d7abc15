from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BackendKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_KIND_UNSPECIFIED: _ClassVar[BackendKind]
    BACKEND_KIND_VLLM: _ClassVar[BackendKind]
    BACKEND_KIND_TGI: _ClassVar[BackendKind]
    BACKEND_KIND_OPENAI: _ClassVar[BackendKind]

class EntrySource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_SOURCE_UNSPECIFIED: _ClassVar[EntrySource]
    ENTRY_SOURCE_FILE: _ClassVar[EntrySource]
    ENTRY_SOURCE_STORE: _ClassVar[EntrySource]

class LimitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIMIT_KIND_UNSPECIFIED: _ClassVar[LimitKind]
    LIMIT_KIND_QUOTA: _ClassVar[LimitKind]
    LIMIT_KIND_BUDGET: _ClassVar[LimitKind]
BACKEND_KIND_UNSPECIFIED: BackendKind
BACKEND_KIND_VLLM: BackendKind
BACKEND_KIND_TGI: BackendKind
BACKEND_KIND_OPENAI: BackendKind
ENTRY_SOURCE_UNSPECIFIED: EntrySource
ENTRY_SOURCE_FILE: EntrySource
ENTRY_SOURCE_STORE: EntrySource
LIMIT_KIND_UNSPECIFIED: LimitKind
LIMIT_KIND_QUOTA: LimitKind
LIMIT_KIND_BUDGET: LimitKind

class Backend(_message.Message):
    __slots__ = ("id", "kind", "base_url", "models", "priority_scheduling", "max_in_flight", "metrics_preset", "waiting_metric", "running_metric", "kv_usage_metric", "tpot_metric", "priority_order", "api_key_env", "fair_share_priority", "preempt")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    METRICS_PRESET_FIELD_NUMBER: _ClassVar[int]
    WAITING_METRIC_FIELD_NUMBER: _ClassVar[int]
    RUNNING_METRIC_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_METRIC_FIELD_NUMBER: _ClassVar[int]
    TPOT_METRIC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_ORDER_FIELD_NUMBER: _ClassVar[int]
    API_KEY_ENV_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: BackendKind
    base_url: str
    models: _containers.RepeatedScalarFieldContainer[str]
    priority_scheduling: bool
    max_in_flight: int
    metrics_preset: str
    waiting_metric: str
    running_metric: str
    kv_usage_metric: str
    tpot_metric: str
    priority_order: str
    api_key_env: str
    fair_share_priority: bool
    preempt: bool
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[BackendKind, str]] = ..., base_url: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., priority_scheduling: _Optional[bool] = ..., max_in_flight: _Optional[int] = ..., metrics_preset: _Optional[str] = ..., waiting_metric: _Optional[str] = ..., running_metric: _Optional[str] = ..., kv_usage_metric: _Optional[str] = ..., tpot_metric: _Optional[str] = ..., priority_order: _Optional[str] = ..., api_key_env: _Optional[str] = ..., fair_share_priority: _Optional[bool] = ..., preempt: _Optional[bool] = ...) -> None: ...

class BackendStatus(_message.Message):
    __slots__ = ("backend", "healthy", "in_flight", "waiting", "running", "tpot_seconds", "draining", "reason")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TPOT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    backend: Backend
    healthy: bool
    in_flight: int
    waiting: float
    running: float
    tpot_seconds: float
    draining: bool
    reason: str
    def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ..., healthy: _Optional[bool] = ..., in_flight: _Optional[int] = ..., waiting: _Optional[float] = ..., running: _Optional[float] = ..., tpot_seconds: _Optional[float] = ..., draining: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class RegisterBackendRequest(_message.Message):
    __slots__ = ("backend",)
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    backend: Backend
    def __init__(self, backend: _Optional[_Union[Backend, _Mapping]] = ...) -> None: ...

class RegisterBackendResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: BackendStatus
    def __init__(self, status: _Optional[_Union[BackendStatus, _Mapping]] = ...) -> None: ...

class DeregisterBackendRequest(_message.Message):
    __slots__ = ("id", "drain")
    ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    id: str
    drain: bool
    def __init__(self, id: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class DeregisterBackendResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBackendsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBackendsResponse(_message.Message):
    __slots__ = ("backends",)
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    backends: _containers.RepeatedCompositeFieldContainer[BackendStatus]
    def __init__(self, backends: _Optional[_Iterable[_Union[BackendStatus, _Mapping]]] = ...) -> None: ...

class GetQueueSnapshotRequest(_message.Message):
    __slots__ = ("top_users",)
    TOP_USERS_FIELD_NUMBER: _ClassVar[int]
    top_users: int
    def __init__(self, top_users: _Optional[int] = ...) -> None: ...

class TierDepth(_message.Message):
    __slots__ = ("tier", "queued")
    TIER_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    tier: str
    queued: int
    def __init__(self, tier: _Optional[str] = ..., queued: _Optional[int] = ...) -> None: ...

class ModelQueue(_message.Message):
    __slots__ = ("model", "queued", "tiers", "queued_users")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_USERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    queued: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierDepth]
    queued_users: int
    def __init__(self, model: _Optional[str] = ..., queued: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierDepth, _Mapping]]] = ..., queued_users: _Optional[int] = ...) -> None: ...

class UserLoad(_message.Message):
    __slots__ = ("user", "queued", "recent_tokens")
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    RECENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    user: str
    queued: int
    recent_tokens: float
    def __init__(self, user: _Optional[str] = ..., queued: _Optional[int] = ..., recent_tokens: _Optional[float] = ...) -> None: ...

class TierGate(_message.Message):
    __slots__ = ("tier", "state")
    TIER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    tier: str
    state: str
    def __init__(self, tier: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class BackendLoad(_message.Message):
    __slots__ = ("status", "gates")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    status: BackendStatus
    gates: _containers.RepeatedCompositeFieldContainer[TierGate]
    def __init__(self, status: _Optional[_Union[BackendStatus, _Mapping]] = ..., gates: _Optional[_Iterable[_Union[TierGate, _Mapping]]] = ...) -> None: ...

class GetQueueSnapshotResponse(_message.Message):
    __slots__ = ("taken_at_unix_seconds", "models", "users", "backends", "known_users")
    TAKEN_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_USERS_FIELD_NUMBER: _ClassVar[int]
    taken_at_unix_seconds: float
    models: _containers.RepeatedCompositeFieldContainer[ModelQueue]
    users: _containers.RepeatedCompositeFieldContainer[UserLoad]
    backends: _containers.RepeatedCompositeFieldContainer[BackendLoad]
    known_users: int
    def __init__(self, taken_at_unix_seconds: _Optional[float] = ..., models: _Optional[_Iterable[_Union[ModelQueue, _Mapping]]] = ..., users: _Optional[_Iterable[_Union[UserLoad, _Mapping]]] = ..., backends: _Optional[_Iterable[_Union[BackendLoad, _Mapping]]] = ..., known_users: _Optional[int] = ...) -> None: ...

class StoredKey(_message.Message):
    __slots__ = ("id", "user", "team", "tiers", "admin", "created_at_unix_seconds", "expires_at_unix_seconds", "revoked_at_unix_seconds", "replaces")
    ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLACES_FIELD_NUMBER: _ClassVar[int]
    id: str
    user: str
    team: str
    tiers: _containers.RepeatedScalarFieldContainer[str]
    admin: bool
    created_at_unix_seconds: float
    expires_at_unix_seconds: float
    revoked_at_unix_seconds: float
    replaces: str
    def __init__(self, id: _Optional[str] = ..., user: _Optional[str] = ..., team: _Optional[str] = ..., tiers: _Optional[_Iterable[str]] = ..., admin: _Optional[bool] = ..., created_at_unix_seconds: _Optional[float] = ..., expires_at_unix_seconds: _Optional[float] = ..., revoked_at_unix_seconds: _Optional[float] = ..., replaces: _Optional[str] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ("user", "team", "tiers", "admin", "expires_in_seconds")
    USER_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    user: str
    team: str
    tiers: _containers.RepeatedScalarFieldContainer[str]
    admin: bool
    expires_in_seconds: float
    def __init__(self, user: _Optional[str] = ..., team: _Optional[str] = ..., tiers: _Optional[_Iterable[str]] = ..., admin: _Optional[bool] = ..., expires_in_seconds: _Optional[float] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ("key", "secret")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: StoredKey
    secret: str
    def __init__(self, key: _Optional[_Union[StoredKey, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("include_revoked",)
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    include_revoked: bool
    def __init__(self, include_revoked: _Optional[bool] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[StoredKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[StoredKey, _Mapping]]] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: StoredKey
    def __init__(self, key: _Optional[_Union[StoredKey, _Mapping]] = ...) -> None: ...

class RotateKeyRequest(_message.Message):
    __slots__ = ("id", "grace_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    grace_seconds: float
    def __init__(self, id: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class RotateKeyResponse(_message.Message):
    __slots__ = ("key", "secret")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: StoredKey
    secret: str
    def __init__(self, key: _Optional[_Union[StoredKey, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class GetUsageReportRequest(_message.Message):
    __slots__ = ("by", "since_unix_seconds", "until_unix_seconds")
    BY_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    by: str
    since_unix_seconds: float
    until_unix_seconds: float
    def __init__(self, by: _Optional[str] = ..., since_unix_seconds: _Optional[float] = ..., until_unix_seconds: _Optional[float] = ...) -> None: ...

class UsageSummary(_message.Message):
    __slots__ = ("name", "requests", "finished", "input_tokens", "output_tokens", "cost", "no_team")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    NO_TEAM_FIELD_NUMBER: _ClassVar[int]
    name: str
    requests: int
    finished: int
    input_tokens: int
    output_tokens: int
    cost: float
    no_team: bool
    def __init__(self, name: _Optional[str] = ..., requests: _Optional[int] = ..., finished: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cost: _Optional[float] = ..., no_team: _Optional[bool] = ...) -> None: ...

class GetUsageReportResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[UsageSummary]
    def __init__(self, rows: _Optional[_Iterable[_Union[UsageSummary, _Mapping]]] = ...) -> None: ...

class Team(_message.Message):
    __slots__ = ("name", "weight", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    source: EntrySource
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ..., source: _Optional[_Union[EntrySource, str]] = ...) -> None: ...

class SetTeamRequest(_message.Message):
    __slots__ = ("team",)
    TEAM_FIELD_NUMBER: _ClassVar[int]
    team: Team
    def __init__(self, team: _Optional[_Union[Team, _Mapping]] = ...) -> None: ...

class SetTeamResponse(_message.Message):
    __slots__ = ("team",)
    TEAM_FIELD_NUMBER: _ClassVar[int]
    team: Team
    def __init__(self, team: _Optional[_Union[Team, _Mapping]] = ...) -> None: ...

class DeleteTeamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTeamResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTeamsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTeamsResponse(_message.Message):
    __slots__ = ("teams",)
    TEAMS_FIELD_NUMBER: _ClassVar[int]
    teams: _containers.RepeatedCompositeFieldContainer[Team]
    def __init__(self, teams: _Optional[_Iterable[_Union[Team, _Mapping]]] = ...) -> None: ...

class Limit(_message.Message):
    __slots__ = ("kind", "team", "user", "model", "tokens_per_minute", "tokens_per_day", "requests_per_minute", "per_day", "per_month", "mode", "source")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_DAY_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    PER_DAY_FIELD_NUMBER: _ClassVar[int]
    PER_MONTH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    kind: LimitKind
    team: str
    user: str
    model: str
    tokens_per_minute: int
    tokens_per_day: int
    requests_per_minute: int
    per_day: float
    per_month: float
    mode: str
    source: EntrySource
    def __init__(self, kind: _Optional[_Union[LimitKind, str]] = ..., team: _Optional[str] = ..., user: _Optional[str] = ..., model: _Optional[str] = ..., tokens_per_minute: _Optional[int] = ..., tokens_per_day: _Optional[int] = ..., requests_per_minute: _Optional[int] = ..., per_day: _Optional[float] = ..., per_month: _Optional[float] = ..., mode: _Optional[str] = ..., source: _Optional[_Union[EntrySource, str]] = ...) -> None: ...

class SetLimitRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: Limit
    def __init__(self, limit: _Optional[_Union[Limit, _Mapping]] = ...) -> None: ...

class SetLimitResponse(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: Limit
    def __init__(self, limit: _Optional[_Union[Limit, _Mapping]] = ...) -> None: ...

class DeleteLimitRequest(_message.Message):
    __slots__ = ("kind", "team", "user", "model")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEAM_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    kind: LimitKind
    team: str
    user: str
    model: str
    def __init__(self, kind: _Optional[_Union[LimitKind, str]] = ..., team: _Optional[str] = ..., user: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class DeleteLimitResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[Limit]
    def __init__(self, limits: _Optional[_Iterable[_Union[Limit, _Mapping]]] = ...) -> None: ...

class ListAuditLogRequest(_message.Message):
    __slots__ = ("limit", "action")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    limit: int
    action: str
    def __init__(self, limit: _Optional[int] = ..., action: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("at_unix_seconds", "actor", "via", "action", "target", "detail", "replica")
    AT_UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    at_unix_seconds: float
    actor: str
    via: str
    action: str
    target: str
    detail: str
    replica: str
    def __init__(self, at_unix_seconds: _Optional[float] = ..., actor: _Optional[str] = ..., via: _Optional[str] = ..., action: _Optional[str] = ..., target: _Optional[str] = ..., detail: _Optional[str] = ..., replica: _Optional[str] = ...) -> None: ...

class ListAuditLogResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...
