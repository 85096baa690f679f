"""What the scheduler tells the shard manager about its jobs' datasets (best effort).

A job's dataset is created by its training processes (idempotently, from the
JobSpec) and belongs to the job: when the job ends, DeleteJobDatasets drops it.
In dynamic mode, when a process dies, ReleaseHolder gives its ESTs' held shards
back at once instead of when their leases run out; it keeps their provisional
acknowledgements (`keep_provisional`): the scheduler does not know which of them
the job's last durable checkpoint holds, the job's next process does (it releases
them at its resume step), so a release here cannot undo what a checkpoint holds.
It carries the generation of the placement whose process died: sent from a pool,
it may arrive after the next placement started, whose own releases fenced the
holders; the shard manager then refuses it (FAILED_PRECONDITION, logged here as
expected) rather than taking back the new placement's shards.
A shard manager that is down costs a log line: a dataset left behind is deleted
with the next end of its job... or expires with its keys; a holder not released
loses its lease.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

import grpc

from gearshift.common.auth import ClientTls
from gearshift.common.channel import OptionalClient
from gearshift.common.errors import rpc_code, rpc_details
from gearshift.common.facts import shard_holder_id
from gearshift.v1 import shardmanager_pb2, shardmanager_pb2_grpc

log = logging.getLogger("gearshift.scheduler.datasets")


class DatasetKeeper:
    """Calls to the shard manager; a no-op without an address."""

    def __init__(
        self,
        address: str = "",
        *,
        token: str | None = None,
        tls: ClientTls | None = None,
        timeout: float = 5.0,
    ):
        self.address = address
        self._timeout = timeout
        self._client = OptionalClient(
            address, shardmanager_pb2_grpc.ShardManagerStub, token=token, tls=tls, timeout=timeout
        )
        self._stub = self._client.stub

    def delete_job(self, job_id: str) -> list[str]:
        """Drop the job's datasets; the ids deleted ([] when none or unreachable)."""
        if self._stub is None:
            return []
        request = shardmanager_pb2.DeleteJobDatasetsRequest(job_id=job_id)
        try:
            reply = self._stub.DeleteJobDatasets(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            log.warning(
                "datasets not deleted",
                extra={"job_id": job_id, "code": str(rpc_code(exc)), "error": rpc_details(exc)},
            )
            return []
        return list(reply.dataset_ids)

    def release(
        self,
        dataset_id: str,
        job_id: str,
        ests: Iterable[int],
        reason: str,
        generation: int = 0,
    ) -> int:
        """Put the shards these ESTs' holders have in DOING back in TODO (their provisional
        acknowledgements stay for the job's next process); how many were requeued.
        `generation`: the ended placement's (0: unfenced); a holder a newer placement
        released already is left alone."""
        requeued = 0
        for est in ests:
            requeued += self._release(dataset_id, job_id, est, reason, generation) or 0
        log.info("holders released", extra={"job_id": job_id, "requeued": requeued})
        return requeued

    def fence(self, dataset_id: str, job_id: str, ests: Iterable[int], generation: int) -> bool:
        """Before a placement of `generation` starts: release its ESTs' holders at that
        generation, so a process of an older placement still running anywhere (on a worker
        declared lost that is not dead) is refused from now on, before the new processes
        read anything. Best effort, and stops at the first failure: the new processes'
        own releases fence the holders too, a little later. True when every holder is."""
        return all(
            self._release(dataset_id, job_id, est, "a newer placement starts", generation)
            is not None
            for est in ests
        )

    def _release(
        self, dataset_id: str, job_id: str, est: int, reason: str, generation: int
    ) -> int | None:
        """One holder's ReleaseHolder (keeping provisional acks): shards requeued, or None."""
        if self._stub is None:
            return None
        request = shardmanager_pb2.ReleaseHolderRequest(
            dataset_id=dataset_id,
            holder_id=shard_holder_id(job_id, est),
            reason=reason,
            keep_provisional=True,
            generation=generation,
            request_id=uuid.uuid4().hex,  # the channel's retries repeat it: one release
        )
        try:
            return int(self._stub.ReleaseHolder(request, timeout=self._timeout).requeued)
        except grpc.RpcError as exc:
            code = rpc_code(exc)
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                log.info(
                    "holder not released: a newer placement holds it",
                    extra={"job_id": job_id, "est": est, "error": rpc_details(exc)},
                )
            elif code != grpc.StatusCode.NOT_FOUND:
                log.warning(
                    "holder not released",
                    extra={"job_id": job_id, "est": est, "error": rpc_details(exc)},
                )
            return 0 if code == grpc.StatusCode.NOT_FOUND else None

    def close(self) -> None:
        self._client.close()
