"""The engine's tiered prefix lookup over plain sets: the reference the index's tier matches are
checked against."""

from __future__ import annotations


def engine_walk(media: dict[str, set[int]], prompt: list[int]) -> tuple[int, int, int]:
    """The engine's lookup over plain sets: a device run, then a host-or-disk run (host
    preferred); ``(device, host, disk)`` blocks."""
    num_device = 0
    while num_device < len(prompt) and prompt[num_device] in media["device"]:
        num_device += 1
    host = disk = 0
    for h in prompt[num_device:]:
        if h in media["host"]:
            host += 1
        elif h in media["disk"]:
            disk += 1
        else:
            break
    return num_device, host, disk
