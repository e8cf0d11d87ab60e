"""The rendezvous's event names in served test jobs (tests/harness/job_server.py): those torch's inspect.stack() gave,
read from the frames alone. Fails, saying so, where torch no longer names its events through get_method_name."""
import inspect

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from tests.harness.job_server import _method_name, name_rendezvous_events_cheaply


def _by_inspect(depth=2):
    """torch's own get_method_name."""
    if len(inspect.stack()) > depth:
        return inspect.stack()[depth].function
    return "no_method_name"


def _record(name_of):            # as a rendezvous's _record asks for its caller's name
    return name_of()


def next_rendezvous(name_of):    # the method an event is named after
    return _record(name_of)


def test_events_keep_the_names_torch_gave_them():
    assert next_rendezvous(_method_name) == next_rendezvous(_by_inspect) == "next_rendezvous"
    assert _method_name(10_000) == _by_inspect(10_000) == "no_method_name"


def test_a_launch_names_its_rendezvous_events_without_inspect_stack(monkeypatch):
    assert hasattr(dynamic_rendezvous, "get_method_name"), \
        ("torch no longer names rendezvous events with get_method_name: tests/harness/job_server.py's shortcut is "
         "dead code")
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", dynamic_rendezvous.get_method_name)
    name_rendezvous_events_cheaply()
    monkeypatch.setattr(inspect, "stack", None)          # any call to it fails
    assert next_rendezvous(dynamic_rendezvous.get_method_name) == "next_rendezvous"
