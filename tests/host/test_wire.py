"""The model host's wire: every message survives encoding, token ids and shared prefixes come back as they went
(prefix objects shared alike), outputs of every dtype and shape come back bit for bit, and the framing keeps
messages whole and in order over a real socket."""

from __future__ import annotations

import socket
from array import array
from dataclasses import replace

import msgspec
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scorekit.host import wire
from scorekit.host.channel import Channel
from scorekit.models.base import Encoded, SharedPrefix
from scorekit.settings import EngineConfig, ModelSpec

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(wire.Message)
INT32 = st.integers(-(2**31), 2**31 - 1)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool)


def round_trip(message: wire.Message) -> wire.Message:
    """Through msgpack as the channel carries it (decoded from a bytearray, as frames are read)."""
    return _DECODER.decode(bytearray(_ENCODER.encode(message)))


@st.composite
def encoded_inputs(draw: st.DrawFn) -> list[Encoded]:
    """Inputs of one job, some pointing to one of a few shared prefix objects (two may have equal lengths)."""
    pool = [SharedPrefix(draw(st.integers(0, 64))) for _ in range(draw(st.integers(0, 3)))]
    prefixes = st.sampled_from([None, *pool])
    items = st.builds(
        Encoded,
        st.lists(INT32, max_size=40).map(lambda ids: array("i", ids)),
        st.none() | st.lists(st.integers(0, 1), max_size=40).map(lambda ids: array("i", ids)),
        st.lists(st.integers(0, 2**20), max_size=4).map(tuple),
        st.booleans(),
        prefixes,
    )
    return draw(st.lists(items, max_size=12))


@given(encoded_inputs(), st.integers(0, 2**40))
def test_inputs_come_back_as_they_went(inputs: list[Encoded], number: int) -> None:
    message = round_trip(wire.submit(number, inputs))
    assert isinstance(message, wire.Submit)
    assert message.job == number
    back = wire.inputs_of(message)
    # An Encoded compares its prefix by identity, which the host cannot keep across processes: checked apart.
    assert [replace(item, prefix=None) for item in back] == [replace(item, prefix=None) for item in inputs]
    for sent, got in zip(inputs, back, strict=True):
        assert (got.prefix is None) == (sent.prefix is None)
        if sent.prefix is not None and got.prefix is not None:
            assert got.prefix.length == sent.prefix.length
    for i, (a, a_back) in enumerate(zip(inputs, back, strict=True)):
        for b, b_back in zip(inputs[i:], back[i:], strict=True):
            same = a.prefix is not None and a.prefix is b.prefix
            assert (a_back.prefix is not None and a_back.prefix is b_back.prefix) == same


def test_inputs_of_one_prefix_share_one_object_on_the_host() -> None:
    shared, other = SharedPrefix(3), SharedPrefix(3)
    inputs = [Encoded(array("i", [1, 2, 3, n]), prefix=p) for n, p in enumerate([shared, other, shared, None])]
    message = round_trip(wire.submit(7, inputs))
    assert isinstance(message, wire.Submit)
    back = wire.inputs_of(message)
    assert back[0].prefix is back[2].prefix
    assert back[1].prefix is not back[0].prefix and back[1].prefix is not None
    assert back[3].prefix is None


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    values = torch.randn(shape, generator=generator, dtype=torch.float64) * 100
    if draw(st.booleans()) and len(shape) >= 2:  # a view that is not contiguous, as rows of a batch can be
        values = values.transpose(0, 1)
    return values.to(dtype)


@given(tensors(), st.integers(0, 2**20))
def test_outputs_come_back_bit_for_bit(value: torch.Tensor, number: int) -> None:
    message = round_trip(wire.Done(number, True, [wire.tensor(value)]))
    assert isinstance(message, wire.Done)
    back = wire.from_wire(message.outputs[0])
    assert back.dtype == value.dtype
    assert back.shape == value.shape
    assert torch.equal(back, value)


@given(st.lists(tensors(), max_size=4))
def test_unpacked_outputs_come_back_each(values: list[torch.Tensor]) -> None:
    message = round_trip(wire.Done(1, False, [wire.tensor(value) for value in values]))
    assert isinstance(message, wire.Done)
    back = [wire.from_wire(output) for output in message.outputs]
    assert [(b.dtype, b.shape) for b in back] == [(v.dtype, v.shape) for v in values]
    assert all(torch.equal(b, v) for b, v in zip(back, values, strict=True))


SMALL = st.integers(0, 2**31)
SECONDS = st.floats(0, 1e6, allow_nan=False)
TEXT = st.text(max_size=200)
SIMPLE_MESSAGES = st.one_of(
    st.builds(wire.Hello, st.just(ModelSpec(path="/m", engine=EngineConfig(max_queue_wait=2.5))), SMALL),
    st.just(wire.Join()),
    st.builds(wire.Ready, TEXT, st.sampled_from(["cross-encoder", "bi-encoder"]), SMALL, SMALL, TEXT),
    st.builds(wire.Abort, SMALL),
    st.builds(wire.Expire, SMALL),
    st.builds(wire.StatsRequest, SMALL),
    st.builds(wire.Started, SMALL, SECONDS),
    st.builds(wire.Failed, SMALL, st.sampled_from(["model_error", "worker_died", "queue_timeout", "overloaded"]), TEXT),
    st.builds(wire.Dropped, SMALL),
    st.builds(wire.Batch, SMALL, SMALL, SECONDS),
    st.builds(wire.Stats, *[SMALL] * 9, st.lists(SMALL, max_size=5), st.lists(SMALL, max_size=5)),
    st.builds(wire.Died, TEXT),
)


@given(SIMPLE_MESSAGES)
def test_every_other_message_round_trips(message: wire.Message) -> None:
    assert round_trip(message) == message


def test_stats_carry_the_worker_counters() -> None:
    stats = wire.Stats(1, 2, 3, 1, 5, 40, 2, 1, 1, [8, 8], [2, 1])
    worker = wire.worker_stats(stats)
    assert (worker.batches, worker.items, worker.items_of_cancelled_jobs, worker.failed_batches) == (5, 40, 2, 1)
    assert list(worker.recent_batch_sizes) == [8, 8]
    assert list(worker.recent_batch_jobs) == [2, 1]


def test_frames_keep_messages_whole_and_in_order_over_a_socket() -> None:
    """Many small frames read from one buffer, and one larger than the writer's flush and the reader's buffer."""
    left, right = socket.socketpair()
    right.settimeout(30)  # a read that waits longer ends the stream
    sender, receiver = Channel(left, name="test-left"), Channel(right, name="test-right")
    try:
        big = torch.arange(600_000, dtype=torch.float32)  # 2.4 MB
        sent: list[wire.Message] = [wire.Batch(n, n * 2, n / 3) for n in range(500)]
        sent.insert(250, wire.Done(9, True, [wire.tensor(big)]))
        for message in sent:
            sender.send(message)
        sender.close_write(timeout=0)  # the writer ends once read: the big frame outgrows the socket's buffer
        got = list(receiver)
    finally:
        sender.close(timeout=1)
        receiver.close(timeout=1)
    assert len(got) == len(sent)
    done = got.pop(250)
    sent.pop(250)
    assert got == sent
    assert isinstance(done, wire.Done)
    assert torch.equal(wire.from_wire(done.outputs[0]), big)


def test_a_write_to_a_closed_peer_reports_it_broken() -> None:
    left, right = socket.socketpair()
    broken: list[bool] = []
    sender = Channel(left, on_broken=lambda: broken.append(True), name="test-left")
    right.close()
    try:
        for _ in range(3):
            sender.send(wire.Died("x" * 100_000))
        sender.close_write(timeout=10)
    finally:
        sender.close(timeout=1)
    assert broken == [True]


def test_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="not a tensor dtype"):
        wire.from_wire(wire.Tensor("Tensor", (1,), memoryview(b"\0\0\0\0")))
