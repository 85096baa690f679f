"""The ResNet example: the ResNet-18 layout when sized up, images fixed by their own seed,
augmentation drawn from the global torch generator (the loader worker's state)."""

from __future__ import annotations

import pytest
import torch

from gearshift.examples.resnet import build


def test_sized_up_it_is_the_resnet18_layout() -> None:
    job = build({"width": 64, "blocks": [2, 2, 2, 2], "image": 32, "samples": 16})
    assert sum(p.numel() for p in job.model.parameters()) == 11_173_962
    assert job.dataset[0][0].shape == (3, 32, 32)


def test_the_images_do_not_depend_on_the_job_seed() -> None:
    torch.manual_seed(1)
    first = build({"augment": False})
    torch.manual_seed(2)
    second = build({"augment": False})
    assert torch.equal(first.dataset[5][0], second.dataset[5][0])
    assert len(first.dataset) == 512 and int(first.dataset[5][1]) in range(10)


def test_augmentation_follows_the_global_generator() -> None:
    job = build({})
    torch.manual_seed(3)
    a = [job.dataset[i][0] for i in range(8)]
    torch.manual_seed(3)
    b = [job.dataset[i][0] for i in range(8)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    plain = build({"augment": False})
    assert any(not torch.equal(x, plain.dataset[i][0]) for i, x in enumerate(a))


def test_a_step_trains_and_bad_blocks_are_refused() -> None:
    job = build({})
    inputs, targets = torch.utils.data.default_collate([job.dataset[i] for i in range(8)])
    loss = job.loss(job.model(inputs), targets)
    loss.backward()  # type: ignore[no-untyped-call]
    assert all(p.grad is not None for p in job.model.parameters())
    with pytest.raises(ValueError, match="blocks"):
        build({"blocks": []})
