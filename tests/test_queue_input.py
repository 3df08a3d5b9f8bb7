"""Bad input: invalid names, bad settings, bad messages, bad receive arguments, lists that are not
lists (on both stores), filters that are no mapping. Each gives its own clear error, and nothing
already stored (messages, settings, channel state) is lost."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
from test_queue_lookahead import broker  # noqa: F401 (fixture)

from journalq.errors import (
    Error,
    InvalidMessageError,
    InvalidNameError,
    InvalidSettingError,
    QueueNotFoundError,
)
from journalq.journal import Scanner
from journalq.queue import Broker, QueueSettings
from journalq.queue.envelope import NOT_A_NUMBER, NUMBER_OUT_OF_RANGE, Attribute, number_problem

BAD_NAMES = [
    "../x", "a/b", "", "x" * 81, ".", "..", ".hidden", "a..b", "/abs", "a\\b", "a b", "é",
    "jobs\n", "jobs\x00", None, 5, b"jobs",
]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the hash of its content."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def filled(store_root: Path | str):
    """A broker with a queue holding messages, one in flight and one finished."""
    with Broker(store_root, sync="none") as broker:
        files = isinstance(store_root, Path)
        q = broker.queue("jobs", visibility_timeout=60)
        q.send_many([b"m0", b"m1", {"body": b"m2", "attributes": {"a": "1"}}, b"m3"])
        (m0,) = q.receive()
        q.delete(m0.receipt)
        (m1,) = q.receive()
        if files:
            q.topic.channel("other")
            before = tree(broker.root)
        yield broker, q, m1
        # after every bad call: nothing stored changed, and the queue works as before
        if files:
            assert tree(broker.root) == before or _only_state_grew(before, tree(broker.root))
            with Scanner(q.topic.path) as scanner:
                assert [m.value[-2:] for m in scanner] == [b"m0", b"m1", b"m2", b"m3"]
        with Broker(broker.root, sync="none") as fresh:
            fq = fresh.queue("jobs")
            assert fq.settings.visibility_timeout == 60
            assert [m.body for m in fq.receive(10)] == [b"m2", b"m3"]
            fq.delete(m1.receipt)
        assert sorted(broker.names()) == ["jobs"]


def no_trace(broker: Broker, name: str) -> bool:
    """Nothing of queue ``name`` is stored: no queue, no file, no node."""
    if isinstance(broker.root, Path):
        return not broker.exists(name) and not (broker.root / name).exists()
    return not broker.exists(name) and broker.client.exists(f"{broker.path}/{name}") is None


def _only_state_grew(before: dict[str, str], after: dict[str, str]) -> bool:
    """Reading may append to a channel's state journal (a task collection); nothing else."""
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    return all("/channels/" in "/" + k and k.endswith((".jnl", ".idx", ".ofs")) or k.startswith("jobs/ofs/")
               for k in changed) and set(before) <= set(after)


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_invalid_queue_and_topic_names(filled, name: object) -> None:
    broker, q, _ = filled
    for make in (broker.queue, broker.topic, broker.exists, broker.delete, q.topic.channel):
        with pytest.raises(InvalidNameError):
            make(name)  # type: ignore[arg-type]
    if name is not None:  # (None: no dead-letter queue, see test_bad_settings)
        with pytest.raises(InvalidNameError):
            broker.queue("fine", dead_letter_queue=name, max_receive_count=3)  # type: ignore[arg-type]
    assert no_trace(broker, "fine")


def test_names_that_are_fine(tmp_path: Path) -> None:
    with Broker(tmp_path, sync="none") as broker:
        for name in ("a", "A-b_c.d", "9", "-x", "_", "x" * 80, "v1.2"):
            broker.queue(name).send(b"x")
        assert sorted(broker.names()) == sorted(["a", "A-b_c.d", "9", "-x", "_", "x" * 80, "v1.2"])
        assert all(p.parent == tmp_path for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "settings",
    [
        {"visibility_timeout": -1},
        {"visibility_timeout": 12 * 3600 + 1},
        {"visibility_timeout": "30"},
        {"visibility_timeout": True},
        {"visibility_timeout": None},
        {"delay": 901},
        {"receive_wait": 21},
        {"max_receive_count": 0, "dead_letter_queue": "dlq"},
        {"max_receive_count": 3},  # no dead-letter queue to move to
        {"retention_seconds": 0},
        {"retention_bytes": 0},
        {"dedup_window": -1},
        {"task_gc_interval": 0},
        {"segment_size": 100},
        {"enums": ["low", "high"]},
        {"enums": {"p": []}},
        {"enums": {"p": ["a", "a"]}},
        {"enums": {"p": ["a", 1]}},
        {"enums": {"p": "low"}},  # a string is not a list of values
        {"enums": {"p": 5}},
        {"enums": {1: ["a"]}},
        {"no_such_setting": 1},
        {"max_receive_count": 2.5, "dead_letter_queue": "dlq"},  # counts are whole numbers
        {"retention_bytes": 1000.5},
        {"segment_size": 8192.5},
        {"fifo": "false"},  # a string, which would have been true
        {"content_based_dedup": 1},
    ],
    ids=repr,
)
def test_bad_settings(filled, settings: dict) -> None:
    broker, q, _ = filled
    with pytest.raises(InvalidSettingError):
        broker.queue("jobs", **settings)  # an existing queue keeps its settings
    with pytest.raises(InvalidSettingError):
        q.configure(**settings)
    with pytest.raises(InvalidSettingError):
        broker.queue("new", **settings)  # a new queue is not created at all
    assert no_trace(broker, "new")
    with pytest.raises(InvalidSettingError):
        QueueSettings(**settings) if "no_such_setting" not in settings else QueueSettings().replace(**settings)


def test_configure_missing_queue(filled) -> None:
    broker, _, _ = filled
    with pytest.raises(QueueNotFoundError):
        broker.configure("missing", visibility_timeout=3)
    with pytest.raises(QueueNotFoundError):
        broker.queue("missing", create=False)
    assert no_trace(broker, "missing")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"retention_bytes": 1.5}', '{"colour": "red"}'])
def test_damaged_settings_file_is_a_setting_error(tmp_path: Path, content: str) -> None:
    with Broker(tmp_path, sync="none") as broker:
        broker.queue("jobs").send(b"x")
    (tmp_path / "jobs" / "queue.json").write_text(content)
    with Broker(tmp_path, sync="none") as broker, pytest.raises(InvalidSettingError, match="queue.json"):
        broker.queue("jobs")


@pytest.mark.parametrize("body", ["text", None, 5, ["a"], {"body": "text"}, {"body": None}], ids=repr)
def test_body_not_bytes(filled, body: object) -> None:
    broker, q, _ = filled
    with pytest.raises(InvalidMessageError):
        q.send(body)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        q.send_many([b"fine", body])  # type: ignore[list-item]  # the batch is not stored at all
    with pytest.raises(InvalidMessageError):
        broker.topic("jobs").send(body)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"delay": -1},
        {"delay": 901},
        {"delay": "1"},
        {"delay": True},
        {"dedup_id": ""},
        {"dedup_id": "x" * 129},
        {"dedup_id": 5},
        {"group_id": ""},
        {"group_id": 7},
        {"attributes": {"": "x"}},
        {"attributes": {"k": True}},
        {"attributes": {"k": None}},
        {"attributes": {"k": [1]}},
        {"filters": {"performance_class": 5}},
        {"filters": {"performance_class": "ultra"}},  # not in the declared enum
        {"metadata": {"not json": object()}},
        {"metadata": {"x": float("nan")}},  # JSON has no NaN: other readers could not parse it
        {"attributes": {"k": float("nan")}},  # an SQS Number is finite
        {"attributes": {"k": float("-inf")}},
        {"attributes": [("k", "v")]},
        # Number values that SQS clients could not read (SQS's own bounds)
        {"attributes": {"k": Attribute("Number", "4x2")}},
        {"attributes": {"k": Attribute("Number.float", "NaN")}},
        {"attributes": {"k": Attribute("Number", "1" * 39)}},
        {"attributes": {"k": Attribute("Number", "1e127")}},
        {"attributes": {"k": 1e200}},
        {"filters": ["performance_class"]},
    ],
    ids=repr,
)
def test_bad_message_options(filled, options: dict) -> None:
    broker, _, _ = filled
    q = broker.queue("jobs", enums={"performance_class": ["low", "standard"]})
    with pytest.raises(InvalidMessageError):
        q.send(b"body", **options)
    with pytest.raises(InvalidMessageError):
        q.send_many([b"fine", {"body": b"body", **options}])
    broker.queue("jobs", enums={})


def test_a_queue_cannot_be_its_own_dead_letter_queue(filled) -> None:
    broker, q, _ = filled
    with pytest.raises(InvalidSettingError, match="own dead-letter queue"):
        q.configure(max_receive_count=2, dead_letter_queue="jobs")
    with pytest.raises(InvalidSettingError, match="own dead-letter queue"):
        broker.queue("new", max_receive_count=2, dead_letter_queue="new")
    assert no_trace(broker, "new")


@pytest.mark.parametrize("message_id", [True, 1, " 1", "1 ", "+1", "1_0", "-1", "1.0", "\u0661", "01", "00"], ids=repr)
def test_ids_that_no_message_has(filled, message_id: object) -> None:
    _, q, _ = filled
    for call in (q.task, q.delete_id, lambda i: q.set_metadata(i, {})):
        with pytest.raises(InvalidMessageError, match="not one of this queue's ids"):
            call(message_id)


def test_task_metadata_that_is_not_json(filled) -> None:
    _, q, m1 = filled
    for metadata in ({"x": float("nan")}, {1, 2}):
        with pytest.raises(InvalidMessageError, match="must be JSON"):
            q.set_metadata(m1.id, metadata)
    assert q.task(m1.id).metadata is None


def test_one_receipt_where_a_list_is_due(filled) -> None:
    _, q, m1 = filled
    with pytest.raises(InvalidSettingError, match="not one receipt"):
        q.delete_many(m1.receipt)  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match=r"not a message \(its receipt is .receipt\)"):
        q.delete_many(m1)  # type: ignore[arg-type]
    assert q.consumers() == {q.consumer_id: [m1.id]}


def test_unknown_message_field(filled) -> None:
    _, q, _ = filled
    with pytest.raises(InvalidMessageError, match="unknown message field"):
        q.send_many([{"body": b"x", "colour": "red"}])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_messages": 0},
        {"max_messages": 10_001},
        {"max_messages": "1"},
        {"max_messages": True},
        {"visibility_timeout": -1},
        {"visibility_timeout": 12 * 3600 + 1},
        {"visibility_timeout": "5"},
        {"wait": -1},
        {"wait": 3601},
        {"wait": "1"},
    ],
    ids=repr,
)
def test_bad_receive_arguments(filled, kwargs: dict) -> None:
    _, q, m1 = filled
    with pytest.raises(Error, match="must be"):
        q.receive(**kwargs)
    # With receipts to delete too: refused before anything is done (on every store).
    with pytest.raises(Error, match="must be"):
        q.receive(**kwargs, delete=[m1.receipt])
    assert q.consumers() == {q.consumer_id: [m1.id]}  # still in flight, not deleted


def test_bad_visibility_change(filled) -> None:
    _, q, m1 = filled
    for seconds in (-1, 12 * 3600 + 1, "1", None, True, float("nan"), float("inf")):
        with pytest.raises(InvalidSettingError):
            q.change_visibility(m1.receipt, seconds)  # type: ignore[arg-type]
        with pytest.raises(InvalidSettingError):
            q.release(m1.receipt, delay=seconds)  # type: ignore[arg-type]
    assert q.consumers() == {q.consumer_id: [m1.id]}  # still hidden as before


@pytest.mark.parametrize(
    "text, problem",
    [
        ("42", None), (" -1.5e3 ", None), (".5", None), ("1" * 38, None), ("1" * 38 + "000", None),
        ("1e126", None), ("9.9e126", None), ("1e-128", None), ("0e999", None), ("-0", None),
        ("1e127", NUMBER_OUT_OF_RANGE), ("1e-129", NUMBER_OUT_OF_RANGE), ("1" * 39, NUMBER_OUT_OF_RANGE),
        ("", NOT_A_NUMBER), ("4x2", NOT_A_NUMBER), ("NaN", NOT_A_NUMBER), ("Infinity", NOT_A_NUMBER),
        ("1_000", NOT_A_NUMBER), ("0x10", NOT_A_NUMBER), ("\u0661", NOT_A_NUMBER),
    ],
)
def test_number_attribute_values(text: str, problem: str | None) -> None:
    assert number_problem(text) == problem


def test_a_bad_number_attribute_is_named_and_nothing_is_stored(filled) -> None:
    _, q, _ = filled  # (the fixture checks that the journal holds what it held)
    with pytest.raises(InvalidMessageError, match="attribute 'price': '12,5' is not a number"):
        q.send_many([b"fine", {"body": b"x", "attributes": {"price": Attribute("Number", "12,5")}}])


def test_number_attributes_within_bounds_are_sent(store_root: Path | str) -> None:
    with Broker(store_root, sync="none") as broker:
        q = broker.queue("jobs")
        q.send(b"ok", attributes={"price": Attribute("Number.eur", "12.5"), "n": 10**40, "f": 0.25})
        [got] = q.receive()
        assert got.attributes == {"price": Attribute("Number.eur", "12.5"), "n": Attribute("Number", "1" + "0" * 40),
                                  "f": Attribute("Number", "0.25")}


# -- lists that are not lists ----------------------------------------------------------------------


NOT_LISTS = [
    (lambda q, r: q.delete_many(None), InvalidSettingError),
    (lambda q, r: q.receive(1, delete=None), InvalidSettingError),
    (lambda q, r: q.change_visibility_many(None), InvalidSettingError),
    (lambda q, r: q.change_visibility_many(r), InvalidSettingError),  # one receipt, not pairs
    (lambda q, r: q.change_visibility_many([r]), InvalidSettingError),
    (lambda q, r: q.change_visibility_many([(r, 1, 2)]), InvalidSettingError),
    (lambda q, r: q.send_many(None), InvalidMessageError),
    (lambda q, r: q.send_many({"body": b"one message"}), InvalidMessageError),
    (lambda q, r: q.send_many(b"one body"), InvalidMessageError),
]


@pytest.mark.parametrize("call, error", NOT_LISTS)
@pytest.mark.parametrize("shards", [1, 2])
def test_lists_of_receipts_changes_and_messages_that_are_not_lists_are_refused_clearly(
    broker: Broker, shards: int, call, error: type
) -> None:
    check_refused(broker.queue("jobs", shards=shards), call, error)


@pytest.mark.parametrize("call, error", NOT_LISTS)
def test_the_zookeeper_store_refuses_them_too(zookeeper_server: Any, call, error: type) -> None:
    with Broker(zookeeper_server.url(f"/audit{time.monotonic_ns()}")) as broker:
        check_refused(broker.queue("jobs"), call, error)


def check_refused(q: Any, call: Any, error: type) -> None:
    q.send(b"x")
    (received,) = q.receive(1)
    with pytest.raises(error, match="list|pair"):
        call(q, received.receipt)
    q.delete(received.receipt)  # nothing was done with it
    assert q.stats().available == 0


@pytest.mark.parametrize("filters", ["", [], 0, False, ()])
def test_message_filters_that_are_no_mapping_are_refused_even_when_empty(broker: Broker, filters: object) -> None:
    q = broker.queue("jobs")
    with pytest.raises(InvalidMessageError, match="filters"):
        q.send(b"x", filters=filters)  # type: ignore[arg-type]
    assert q.send(b"x", filters={}) == "0"  # an empty mapping is no filter
