"""The example training script's sequence-length curriculum (the drifting job of issue 14;
it runs for real in ``tests/backend/swap/test_swap_end_to_end.py``)."""

from __future__ import annotations

import argparse

import pytest

from backend.demo.swap_drift import _example

pytest.importorskip("torch")


def test_the_curriculum_sets_each_steps_length_and_the_model_fits_the_longest() -> None:
    example = _example()
    args = example.parse_args(["--curriculum", "40:128,0:64", "--seq", "16"])
    assert args.curriculum == [(0, 64), (40, 128)]
    assert [example.seq_at(args, s) for s in (0, 39, 40, 500)] == [64, 64, 128, 128]
    assert example.longest(args) == 128
    plain = example.parse_args(["--seq", "16"])
    assert (example.seq_at(plain, 7), example.longest(plain)) == (16, 16)


@pytest.mark.parametrize("text", ["5:64,40:128", "0:64,x:128", "0:0", "64"])
def test_a_curriculum_that_cannot_be_read_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _example().curriculum(text)
