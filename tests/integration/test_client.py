"""The SDK against a real scheduler process: typed errors carry the server's message."""

from __future__ import annotations

import pytest

from gearshift.client import Client, NotFoundError, ValidationError
from gearshift.v1 import common_pb2
from tests.conftest import DaemonFactory


def test_sdk_raises_typed_errors(daemons: DaemonFactory) -> None:
    daemon = daemons("scheduler")
    spec = common_pb2.JobSpec(
        name="j",
        entrypoint=common_pb2.Entrypoint(module="gearshift.examples.mlp"),
        num_ests=4,
        global_batch_size=10,
        total_steps=1,
        dataset=common_pb2.DatasetSpec(size=10, shard_size=1),
    )
    with Client(daemon.address) as client:
        with pytest.raises(ValidationError) as exc:
            client.submit(spec)
        assert exc.value.field == "spec.global_batch_size"
        with pytest.raises(NotFoundError, match="job-1"):
            client.get("job-1")
