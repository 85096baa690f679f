"""The digits example's held-out split is fixed, disjoint, and leaves every global RNG alone."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import pytest
import torch

from gearshift.examples.digits_cnn import Digits, split


def test_split_is_fixed_and_disjoint() -> None:
    train, test = split(1797, 297)
    again_train, again_test = split(1797, 297)
    assert (train == again_train).all() and (test == again_test).all()
    assert len(train) == 1500 and len(test) == 297
    assert not set(train) & set(test)
    assert sorted([*train, *test]) == list(range(1797))
    whole, none = split(1797, 0)
    assert (whole == np.arange(1797)).all() and len(none) == 0
    with pytest.raises(ValueError, match="holdout"):
        split(1797, 1797)


def _numpy_key() -> np.ndarray:
    state = cast(tuple[Any, ...], np.random.get_state(legacy=True))
    return np.array(state[1], copy=True)


def test_split_moves_no_global_random_state() -> None:
    torch_before, python_before = torch.get_rng_state(), random.getstate()
    numpy_before = _numpy_key()
    Digits(augment=False, holdout=297)
    assert torch.equal(torch_before, torch.get_rng_state())
    assert (numpy_before == _numpy_key()).all()
    assert python_before == random.getstate()
