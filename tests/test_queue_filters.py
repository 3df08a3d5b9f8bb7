"""zkmq's filters and task states: messages say what they need, consumers what they offer
(``absolute`` or ``at_least`` in an ordered enum); every message has a state (inserted, claimed,
finished, dead) with JSON metadata; active consumers are listed; finished tasks are collected."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from journalq.errors import InvalidMessageError, InvalidSettingError, TaskNotFoundError
from journalq.queue import Broker
from journalq.queue.filters import matches, normalize

ENUMS = {"performance_class": ["low", "standard", "performance", "high_performance"]}


@pytest.fixture
def broker(store_root: Path | str):
    with Broker(store_root, sync="none") as b:
        yield b


@pytest.fixture
def tasks(broker: Broker):
    return broker.queue("tasks", enums=ENUMS)


def consumer(broker: Broker, name: str = "tasks"):
    """Another consumer of the same queue: its own broker, as another process would have."""
    other = Broker(broker.root, sync="none")
    return other, other.queue(name)


# -- zkmq's examples ---------------------------------------------------------------------------


def test_absolute_a_standard_node_is_chosen(broker: Broker, tasks) -> None:
    task_id = tasks.send(b"task", filters={"performance_class": "standard"})
    hp_broker, hp_node = consumer(broker)
    std_broker, std_node = consumer(broker)
    with hp_broker, std_broker:
        assert hp_node.receive(filters={"performance_class": "high_performance"}) == []
        assert hp_node.receive(filters={"performance_class": ("high_performance", "absolute")}) == []
        (got,) = std_node.receive(filters={"performance_class": "standard"})
        assert got.id == task_id and got.filters == {"performance_class": "standard"}
        assert std_node.task(task_id).state == "claimed"


def test_at_least_the_high_performance_node_can_take_it(broker: Broker, tasks) -> None:
    task_id = tasks.send(b"task", filters={"performance_class": "standard"})
    low_broker, low_node = consumer(broker)
    hp_broker, hp_node = consumer(broker)
    with low_broker, hp_broker:
        assert low_node.receive(filters={"performance_class": ("low", "at_least")}) == []
        (got,) = hp_node.receive(filters={"performance_class": ("high_performance", "at_least")})
        assert got.id == task_id
        # at_least includes equality (hp_node still holds the first: its session is open)
        tasks.send(b"second", filters={"performance_class": "standard"})
        assert [m.body for m in tasks.receive(filters={"performance_class": ("standard", "at_least")})] == [b"second"]


def test_filter_rules(broker: Broker, tasks) -> None:
    tasks.send_many(
        [
            {"body": b"std", "filters": {"performance_class": "standard"}},
            {"body": b"any"},  # no filters: every consumer may take it
            {"body": b"std+gpu", "filters": {"performance_class": "standard", "gpu": "yes"}},
            {"body": b"perf", "filters": {"performance_class": "performance"}},
        ]
    )
    # a message's filter that the consumer does not offer keeps the message from it
    got = tasks.receive(10, filters={"performance_class": ("high_performance", "at_least")}, visibility_timeout=0)
    assert [m.body for m in got] == [b"std", b"any", b"perf"]
    got = tasks.receive(10, filters={"performance_class": "standard", "gpu": "yes"}, visibility_timeout=0)
    assert [m.body for m in got] == [b"std", b"any", b"std+gpu"]
    # a consumer's filter that the message does not mention does not matter
    got = tasks.receive(10, filters={"region": "eu"}, visibility_timeout=0)
    assert [m.body for m in got] == [b"any"]
    # no filters at all (None) takes everything, in order
    got = tasks.receive(10, visibility_timeout=0)
    assert [m.body for m in got] == [b"std", b"any", b"std+gpu", b"perf"]


def test_filtered_message_far_behind_others_is_found_at_once(broker: Broker, tasks) -> None:
    tasks.send_many([{"body": b"s" * 400, "filters": {"performance_class": "standard"}} for _ in range(300)])
    tasks.send(b"wanted", filters={"performance_class": "high_performance"})
    (got,) = tasks.receive(filters={"performance_class": "high_performance"}, wait=0)
    assert got.body == b"wanted"
    assert len(tasks.receive(10_000, filters={"performance_class": "standard"})) == 300


def test_filters_are_pure_functions() -> None:
    enums = {k: tuple(v) for k, v in ENUMS.items()}
    std = {"performance_class": "standard"}
    assert matches(std, normalize({"performance_class": "standard"}, enums), enums)
    assert not matches(std, normalize({"performance_class": "high_performance"}, enums), enums)
    assert matches(std, normalize({"performance_class": ("high_performance", "at_least")}, enums), enums)
    assert matches(std, normalize({"performance_class": ("performance", "at_least")}, enums), enums)
    assert not matches(std, normalize({"performance_class": ("low", "at_least")}, enums), enums)
    assert matches({}, normalize({}, enums), enums)
    assert not matches(std, normalize({}, enums), enums)
    assert matches(std, None, enums)


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"performance_class": ("standard", "most")}, "method must be absolute or at_least"),
        ({"performance_class": ("ultra", "at_least")}, "not one of"),
        ({"performance_class": "ultra"}, "not one of"),  # absolute, but not a declared value
        ({"performance_class": ("standard",)}, "performance_class"),
        ({"performance_class": ("standard", "at_least", "x")}, "performance_class"),
        ({"performance_class": 5}, "performance_class"),
        ({"performance_class": None}, "performance_class"),
        ({"performance_class": (5, "absolute")}, "must be a string"),
        ({"region": ("eu", "at_least")}, "no ordered enum"),
        ({5: "x"}, "filter"),
        (["performance_class"], "filters"),
        ("performance_class", "filters"),
    ],
    ids=repr,
)
def test_bad_consumer_filters_give_clear_errors(tasks, filters: object, message: str) -> None:
    tasks.send(b"task", filters={"performance_class": "standard"})
    with pytest.raises(InvalidMessageError, match=message):
        tasks.receive(filters=filters)  # type: ignore[arg-type]
    assert tasks.stats().in_flight == 0


def test_bad_message_filters_give_clear_errors(tasks) -> None:
    with pytest.raises(InvalidMessageError, match="not one of"):
        tasks.send(b"x", filters={"performance_class": "ultra"})
    with pytest.raises(InvalidMessageError, match="strings to strings"):
        tasks.send(b"x", filters={"performance_class": 3})
    with pytest.raises(InvalidSettingError):
        tasks.configure(enums={"performance_class": ["low", "low"]})
    assert tasks.stats().available == 0


# -- task states -------------------------------------------------------------------------------


def test_task_states_and_metadata(broker: Broker, tasks) -> None:
    a = tasks.send(b"a", metadata={"step": 0}, filters={"performance_class": "low"})
    b = tasks.send(b"b")
    t = tasks.task(a)
    assert (t.state, t.metadata, t.receive_count, t.consumer) == ("inserted", {"step": 0}, 0, None)
    assert t.filters == {"performance_class": "low"}
    (ma,) = tasks.receive()
    assert ma.metadata == {"step": 0}
    t = tasks.task(a)
    assert (t.state, t.receive_count, t.consumer) == ("claimed", 1, tasks.consumer_id)
    tasks.set_metadata(a, {"step": 1, "progress": [1, 2]})
    with Broker(broker.root, sync="none") as other:
        seen = other.queue("tasks").task(a)  # readable by id from another process
        assert (seen.state, seen.metadata) == ("claimed", {"step": 1, "progress": [1, 2]})
    tasks.delete(ma.receipt)
    t = tasks.task(a)
    assert (t.state, t.metadata) == ("finished", {"step": 1, "progress": [1, 2]})
    assert tasks.task(b).state == "inserted"
    with pytest.raises(TaskNotFoundError):
        tasks.task("99")
    with pytest.raises(TaskNotFoundError):
        tasks.set_metadata("99", {})
    with pytest.raises(InvalidMessageError):
        tasks.task("not-an-id")
    with pytest.raises(Exception, match="JSON"):
        tasks.set_metadata(b, {"x": object()})


def test_claimed_task_expires_back_to_inserted(tasks) -> None:
    mid = tasks.send(b"x")
    tasks.receive(visibility_timeout=0.5)
    assert tasks.task(mid).state == "claimed"
    time.sleep(0.55)
    assert tasks.task(mid).state == "inserted"


def test_dead_task_state(broker: Broker) -> None:
    q = broker.queue("tasks", max_receive_count=1, dead_letter_queue="dead")
    mid = q.send(b"x", metadata={"tries": 1})
    q.receive(visibility_timeout=0)
    q.receive()
    t = q.task(mid)
    assert (t.state, t.metadata) == ("dead", {"tries": 1})
    (dead,) = broker.queue("dead").receive()
    assert dead.metadata == {"tries": 1}


def test_consumers_lists_what_each_holds(broker: Broker, tasks) -> None:
    ids = tasks.send_many([b"0", b"1", b"2", b"3"])
    other_broker, other = consumer(broker)
    with other_broker:
        tasks.receive(2)
        other.receive(1)
        other.receive(1, visibility_timeout=0.05)
        time.sleep(0.06)
        held = tasks.consumers()
        assert held == {tasks.consumer_id: ids[:2], other.consumer_id: [ids[2]]}
        assert other.consumers() == held
        assert tasks.consumer_id != other.consumer_id


def test_finished_tasks_are_collected(broker: Broker) -> None:
    q = broker.queue("tasks", task_gc_lifetime=0.2, task_gc_interval=0.05)
    plain, with_meta, open_ = q.send(b"plain"), q.send(b"meta", metadata={"m": 1}), q.send(b"open")
    got = q.receive(2)
    q.delete_many([m.receipt for m in got])
    (held,) = q.receive(visibility_timeout=60)
    assert q.task(plain).state == "finished" and q.task(with_meta).state == "finished"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        q.receive(wait=0)  # collections run as consumers come by, every task_gc_interval
        try:
            q.task(with_meta)
            q.task(plain)
        except TaskNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("finished tasks were never collected")
    time.sleep(0.3)
    q.receive(wait=0)
    for gone in (plain, with_meta):
        with pytest.raises(TaskNotFoundError):
            q.task(gone)
    assert q.task(open_).state == "claimed"  # a task still open is never collected
    q.delete(held.receipt)
    with Broker(broker.root, sync="none") as other:  # the collection is in the state journal
        with pytest.raises(TaskNotFoundError):
            other.queue("tasks").task(plain)
