"""``hvdcomp.state.StateStore``: spares are the replaced values of keys that ask for them, never
the committed value, for arrays and tuple values alike (pure unit tests)."""
import numpy as np

from hvdcomp.state import StateStore


def _step(store, key, value):
    store.put(key, value)
    store.commit()


def test_array_spares_cycle_and_never_hand_out_the_committed_value():
    store, like = StateStore(), np.zeros(4, np.float32)
    a = np.ones(4, np.float32)
    _step(store, "w", a)
    b = store.spare("w", like)
    assert b is not a  # nothing replaced yet: a new buffer
    _step(store, "w", b)
    c = store.spare("w", like)
    assert c is a  # the value b replaced
    store.put("w", c)
    store.rollback()  # a failed step: b stays the state, the spare it took is gone
    assert store.get("w") is b
    assert store.spare("w", like) is not b


def test_tuple_spares_by_part():
    store, like = StateStore(), np.zeros(3)
    first = (np.ones(3), np.ones(3))
    _step(store, "m", first)
    second = tuple(store.spare("m", like, part) for part in (0, 1))
    assert not any(x is y for x in second for y in first)
    _step(store, "m", second)
    third = tuple(store.spare("m", like, part) for part in (0, 1))
    assert third[0] is first[0] and third[1] is first[1]
    assert store.spare("m", like, 0) is not first[0]  # each spare is handed out once


def test_values_of_keys_without_spares_are_dropped():
    store, like = StateStore(), np.zeros(2)
    old = np.ones(2)
    _step(store, "k", old)
    _step(store, "k", np.full(2, 2.0))
    assert store.spare("k", like) is not old  # not kept: nobody asked for spares of "k"


def test_a_value_that_shares_an_array_with_its_successor_is_not_a_spare():
    store, like = StateStore(), np.zeros(2)
    m, v = np.ones(2), np.ones(2)
    store.spare("s", like)  # "s" uses spares
    _step(store, "s", (m, v))
    _step(store, "s", (m, np.zeros(2)))  # m updated in place and kept
    assert store.spare("s", like, 0) is not m


def _address(array):
    return array.__array_interface__["data"][0]


def test_an_outgoing_buffer_is_handed_out_again_only_once_nobody_holds_it():
    store, like = StateStore(), np.zeros(4, np.float32)
    first = store.outgoing("w#message", like, 7)
    assert first.shape == (7,) and first.dtype == np.float32
    kept = _address(first)
    view = first[:4]  # e.g. the step handed back as the gradient
    del first
    second = store.outgoing("w#message", like, 7)  # the view holds the first: a new one
    assert not np.shares_memory(second, view)
    kept, second = _address(second), None
    assert _address(store.outgoing("w#message", like, 7)) == kept  # released: reused
    assert store.outgoing("w#message", like, 8).shape == (8,)  # another size: a new one
    assert store.outgoing("w#message", np.zeros(4), 8).dtype == np.float64


def test_an_outgoing_buffer_held_by_a_torch_tensor_is_not_reused():
    import torch
    store, like = StateStore(), np.zeros(4, np.float32)
    grad = torch.from_numpy(store.outgoing("w#message", like, 7)[:4])  # p.grad set to it
    again = store.outgoing("w#message", like, 7)
    assert not np.shares_memory(again, grad.numpy())
    kept, again = _address(again), None
    assert _address(store.outgoing("w#message", like, 7)) == kept  # the tensor still holds
    assert not np.shares_memory(store.outgoing("w#message", like, 7), grad.numpy())  # the first
