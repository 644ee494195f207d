from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("transfer_id", "block_indices", "layout_fingerprint", "exporter_epoch")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDICES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EXPORTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    block_indices: _containers.RepeatedScalarFieldContainer[int]
    layout_fingerprint: str
    exporter_epoch: str
    def __init__(self, transfer_id: _Optional[str] = ..., block_indices: _Optional[_Iterable[int]] = ..., layout_fingerprint: _Optional[str] = ..., exporter_epoch: _Optional[str] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset_bytes", "total_bytes", "crc32", "payload")
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    offset_bytes: int
    total_bytes: int
    crc32: int
    payload: bytes
    def __init__(self, offset_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., crc32: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

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
    __slots__ = ("transfer_id",)
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    def __init__(self, transfer_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
