"""The Serve request router reads a request's LoRA adapter from its routing keys and each
replica's resident adapters from its routing stats: the request goes where its adapter is."""

from __future__ import annotations

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from cluster.routing.serve_router import PrefixAwareRequestRouter
from core.codec import to_plain
from core.messages import DecodeRequest, RoutingKeys
from core.sampling import SamplingParams
from tests.unit.cluster.routing.test_serve_router import (
    choose,
    event_loop,  # noqa: F401  (the fixture)
    index_with,
    make_router,
    replica,
)


def pending(request_id: str, lora_name: str | None) -> PendingRequest:
    keys = RoutingKeys((), 9, lora_name=lora_name)
    request = DecodeRequest(request_id, list(range(9)), SamplingParams(), keys)
    metadata = RequestMetadata(request_id=request_id, internal_request_id=f"int-{request_id}")
    return PendingRequest(args=[to_plain(request)], kwargs={}, metadata=metadata)


def test_a_request_goes_to_the_replica_holding_its_adapter() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("decode"), pool="decode")
    stats = {"kv_blocks_used": 0, "kv_blocks_free": 100}
    holder = replica("a", **stats, device_adapters=["sql"])
    other = replica("b", **stats, host_adapters=["chat"])
    assert choose(router, [other, holder], pending("r1", "sql"))[0] == "a"
    assert choose(router, [other, holder], pending("r2", "sql"))[0] == "a"  # though it is busier
    assert choose(router, [holder, other], pending("r3", "chat"))[0] == "b"
    assert choose(router, [holder, other], pending("r4", None))[0] == "b"  # base: by load
