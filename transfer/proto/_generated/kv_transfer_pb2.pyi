from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_XXH3_64: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_NONE: _ClassVar[ChecksumAlgorithm]
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm
CHECKSUM_ALGORITHM_XXH3_64: ChecksumAlgorithm
CHECKSUM_ALGORITHM_NONE: ChecksumAlgorithm

class PullRequest(_message.Message):
    __slots__ = ("transfer_id", "block_indices", "layout_fingerprint", "exporter_epoch", "accepted_checksums", "keep_export", "same_node", "shard_rank", "head_start", "head_count", "device", "kv_compat")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    KEEP_EXPORT_FIELD_NUMBER: _ClassVar[int]
    SAME_NODE_FIELD_NUMBER: _ClassVar[int]
    SHARD_RANK_FIELD_NUMBER: _ClassVar[int]
    HEAD_START_FIELD_NUMBER: _ClassVar[int]
    HEAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KV_COMPAT_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_indices: _containers.RepeatedScalarFieldContainer[int]
    layout_fingerprint: str
    exporter_epoch: str
    accepted_checksums: _containers.RepeatedScalarFieldContainer[ChecksumAlgorithm]
    keep_export: bool
    same_node: bool
    shard_rank: int
    head_start: int
    head_count: int
    device: bool
    kv_compat: str
    def __init__(self, transfer_id: _Optional[str] = ..., block_indices: _Optional[_Iterable[int]] = ..., layout_fingerprint: _Optional[str] = ..., exporter_epoch: _Optional[str] = ..., accepted_checksums: _Optional[_Iterable[_Union[ChecksumAlgorithm, str]]] = ..., keep_export: _Optional[bool] = ..., same_node: _Optional[bool] = ..., shard_rank: _Optional[int] = ..., head_start: _Optional[int] = ..., head_count: _Optional[int] = ..., device: _Optional[bool] = ..., kv_compat: _Optional[str] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset_bytes", "total_bytes", "crc32", "payload", "checksum_algorithm", "checksum64", "source_block_ids")
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM64_FIELD_NUMBER: _ClassVar[int]
    SOURCE_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    offset_bytes: int
    total_bytes: int
    crc32: int
    payload: bytes
    checksum_algorithm: ChecksumAlgorithm
    checksum64: int
    source_block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offset_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., crc32: _Optional[int] = ..., payload: _Optional[bytes] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum64: _Optional[int] = ..., source_block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("transfer_id",)
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    def __init__(self, transfer_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_deadline_unix_ms",)
    LEASE_DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    lease_deadline_unix_ms: int
    def __init__(self, lease_deadline_unix_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("transfer_id", "completed")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    completed: bool
    def __init__(self, transfer_id: _Optional[str] = ..., completed: _Optional[bool] = ...) -> None: ...

class AwaitRequest(_message.Message):
    __slots__ = ("transfer_id", "min_ready_blocks", "wait_ms")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    min_ready_blocks: int
    wait_ms: int
    def __init__(self, transfer_id: _Optional[str] = ..., min_ready_blocks: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class AwaitResponse(_message.Message):
    __slots__ = ("num_ready_blocks", "done", "first_token_id", "prompt_chunk_ends")
    NUM_READY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHUNK_ENDS_FIELD_NUMBER: _ClassVar[int]
    num_ready_blocks: int
    done: bool
    first_token_id: int
    prompt_chunk_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_ready_blocks: _Optional[int] = ..., done: _Optional[bool] = ..., first_token_id: _Optional[int] = ..., prompt_chunk_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
