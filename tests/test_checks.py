"""The shared argument checks: each rejects bad input with an error naming the argument."""

import pytest
import torch

from pecode._checks import check_int, check_integer_tensor, check_position_pair, check_positions


def test_check_int_accepts_ints_at_the_minimum_and_rejects_the_rest():
    assert check_int("n", 3) == 3
    assert check_int("n", 0, minimum=0) == 0
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        check_int("n", True)
    with pytest.raises(TypeError, match="n must be an int, got float"):
        check_int("n", 2.0)
    with pytest.raises(ValueError, match="n must be positive, got 0"):
        check_int("n", 0)
    with pytest.raises(ValueError, match="n must be non-negative, got -1"):
        check_int("n", -1, minimum=0)
    with pytest.raises(ValueError, match="n must be at least 2, got 1"):
        check_int("n", 1, minimum=2)


def test_check_positions_wants_integer_tensors_of_one_or_two_dimensions():
    positions = torch.arange(4)
    assert check_positions("p", positions) is positions
    assert check_positions("p", positions.view(2, 2)).shape == (2, 2)
    for bad in ([0, 1], torch.arange(4.0), torch.ones(3, dtype=torch.bool)):
        with pytest.raises(TypeError, match=r"^p must be"):
            check_positions("p", bad)
    for bad in (torch.tensor(3), torch.zeros(1, 2, 3, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"^p must have shape \[L\] or \[B, L\]"):
            check_positions("p", bad)


def test_check_position_pair_names_the_bad_side_and_compares_batches():
    check_position_pair(torch.arange(3), torch.zeros(2, 5, dtype=torch.long))
    check_position_pair(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(TypeError, match=r"^k_positions"):
        check_position_pair(torch.arange(3), torch.arange(3.0))
    with pytest.raises(ValueError, match="different batch sizes: 2 and 3"):
        check_position_pair(
            torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long)
        )


def test_check_integer_tensor_accepts_any_shape_and_names_the_argument():
    assert check_integer_tensor("offsets", torch.zeros(2, 3, 4, dtype=torch.int32)).dim() == 3
    for bad in (
        torch.zeros(3),
        torch.zeros(3, dtype=torch.bool),
        torch.zeros(3, dtype=torch.cfloat),
    ):
        with pytest.raises(TypeError, match="offsets must be an integer tensor"):
            check_integer_tensor("offsets", bad)
    with pytest.raises(TypeError, match=r"offsets must be a torch\.Tensor, got list"):
        check_integer_tensor("offsets", [1, 2])
