"""The step's host <-> device copies on a CPU: the same calls, counted waits, no copies made."""

from __future__ import annotations

import torch

from engine.device_io import DeviceReader, stage, upload

CPU = torch.device("cpu")


def test_upload_and_stage_make_tensors_of_the_asked_dtype() -> None:
    ids = upload([3, 1, 2], torch.long, CPU)
    assert ids.dtype == torch.long and ids.tolist() == [3, 1, 2]
    table = stage([[1, 2], [3, 4]], torch.int32, CPU)
    assert table.shape == (2, 2) and not table.is_pinned()  # pinned only for CUDA


def test_a_read_hands_back_its_tensors_and_counts_one_wait() -> None:
    reader = DeviceReader(CPU)
    ids, values = torch.tensor([4, 5]), torch.tensor([0.5])
    pending = reader.start([ids, values])
    assert reader.num_waits == 0  # starting a read waits for nothing
    host = pending.wait()
    assert [t.tolist() for t in host] == [[4, 5], [0.5]]
    assert reader.num_waits == 1
    with reader.forbid_other_syncs():  # nothing to forbid on a CPU
        reader.start([ids]).wait()
    assert reader.num_waits == 2
