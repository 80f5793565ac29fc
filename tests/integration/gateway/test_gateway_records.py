"""The record-level API (`tidelog.v1.Records`) through the gateway, as a
client in any language sees it: requests written as the JSON a grpcurl user
types (parsed by protobuf's own JSON mapping, as grpcurl does), records as
fields, no record-batch code on the client."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format
from tidelog import AdminClient, NewTopic
from tidelog.partitioner import partition_for_key
from tidelog.v1 import common_pb2, records_pb2, records_pb2_grpc

from tests.support.gateway import GatewayProcess

pytestmark = pytest.mark.timeout(120)


def produce_request(text: str) -> records_pb2.RecordsProduceRequest:
    return json_format.Parse(text, records_pb2.RecordsProduceRequest())


def consume_request(text: str) -> records_pb2.ConsumeRequest:
    return json_format.Parse(text, records_pb2.ConsumeRequest())


def test_produce_and_consume_records_written_as_json(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 3)])
    requests = [
        produce_request(
            '{"correlationId": "1", "acks": "ACKS_ALL", "records": ['
            f'{{"topic": "{topic}", "keyText": "alice", "valueText": "hello",'
            ' "headers": [{"key": "trace", "value": "dDE="}]},'
            f'{{"topic": "{topic}", "keyText": "bob", "valueText": "hi"}}]}}'
        ),
        produce_request(
            '{"correlationId": "2", "records": ['
            f'{{"topic": "{topic}", "partition": 2, "value": "/4D/"}},'
            f'{{"topic": "{topic}-missing", "valueText": "lost"}}]}}'
        ),
    ]
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        answers = list(stub.Produce(iter(requests), timeout=60))
        assert [a.correlation_id for a in answers] == [1, 2]
        alice, bob = answers[0].results
        assert alice.partition == partition_for_key(b"alice", 3) and alice.offset >= 0
        assert bob.partition == partition_for_key(b"bob", 3) and not bob.HasField("error")
        raw, missing = answers[1].results
        assert (raw.partition, raw.error.code) == (2, 0)
        assert missing.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        assert f"{topic}-missing" in missing.error.message

        consume = consume_request(
            '{"text": true, "creditRecords": "10", "positions": ['
            + ",".join(
                f'{{"topic": "{topic}", "partition": {p}, "spec": "EARLIEST"}}' for p in range(3)
            )
            + "]}"
        )
        got: list[records_pb2.ConsumedRecord] = []
        for response in stub.Consume(iter([consume]), timeout=60):
            got.extend(response.records)
            if len(got) == 3:
                break
    by_value = {r.value_text or r.value.hex(): r for r in got}
    assert set(by_value) == {"hello", "hi", "ff80ff"}
    assert by_value["hello"].key_text == "alice"
    assert [(h.key, h.value) for h in by_value["hello"].headers] == [("trace", b"t1")]
    assert by_value["ff80ff"].partition == 2 and by_value["ff80ff"].WhichOneof("key_kind") is None


def test_consume_credit_paces_the_stream(gateway: GatewayProcess, names: tuple[str, str]) -> None:
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 1)])
    records = [records_pb2.ProduceRecord(topic=topic, value_text=str(i)) for i in range(20)]
    requests: queue.Queue[records_pb2.ConsumeRequest | None] = queue.Queue()

    def stream() -> Iterator[records_pb2.ConsumeRequest]:
        while (request := requests.get()) is not None:
            yield request

    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        list(stub.Produce(iter([records_pb2.RecordsProduceRequest(records=records)]), timeout=60))
        requests.put(
            records_pb2.ConsumeRequest(
                text=True,
                credit_records=5,
                positions=[records_pb2.ConsumePosition(topic=topic, partition=0, offset=3)],
            )
        )
        responses = stub.Consume(stream(), timeout=60)
        first: list[str] = []
        while len(first) < 5:
            first.extend(r.value_text for r in next(responses).records)
        assert first == ["3", "4", "5", "6", "7"]
        requests.put(records_pb2.ConsumeRequest(credit_records=2))
        more: list[str] = []
        while len(more) < 2:
            more.extend(r.value_text for r in next(responses).records)
        assert more == ["8", "9"]
        # A position out of range is reported for its partition, in-band.
        requests.put(
            records_pb2.ConsumeRequest(
                credit_records=1,
                positions=[records_pb2.ConsumePosition(topic=topic, partition=0, offset=999)],
            )
        )
        errors = next(responses).errors
        assert errors[0].error.code == common_pb2.OFFSET_OUT_OF_RANGE
        requests.put(None)
        responses.cancel()


def test_bad_record_requests_get_invalid_argument(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    topic, _ = names
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        too_many = records_pb2.RecordsProduceRequest(
            records=[records_pb2.ProduceRecord(topic=topic)] * 10_001
        )
        with pytest.raises(grpc.RpcError) as produce_error:
            list(stub.Produce(iter([too_many]), timeout=30))
        assert produce_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "10000" in (produce_error.value.details() or "")
        bad_acks = records_pb2.RecordsProduceRequest(acks=42)  # type: ignore[arg-type]
        with pytest.raises(grpc.RpcError) as acks_error:
            list(stub.Produce(iter([bad_acks]), timeout=30))
        assert acks_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as credit_error:
            list(stub.Consume(iter([records_pb2.ConsumeRequest(credit_records=-1)]), timeout=30))
        assert credit_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "credit_records" in (credit_error.value.details() or "")


def test_a_failing_partition_is_told_apart_from_its_namesakes(
    gateway: GatewayProcess, names: tuple[str, str]
) -> None:
    """Partition 11's error is about partition 11 only, although "t-1" is
    a prefix of "t-11": the gateway reads the partition from the error."""
    topic, _ = names
    with AdminClient(gateway.address) as admin:
        admin.create_topics([NewTopic(topic, 12)])
    with grpc.insecure_channel(gateway.address) as channel:
        stub = records_pb2_grpc.RecordsStub(channel)
        records = [records_pb2.ProduceRecord(topic=topic, partition=1, value_text="one")]
        list(stub.Produce(iter([records_pb2.RecordsProduceRequest(records=records)]), timeout=60))
        requests: queue.Queue[records_pb2.ConsumeRequest | None] = queue.Queue()

        def stream() -> Iterator[records_pb2.ConsumeRequest]:
            while (request := requests.get()) is not None:
                yield request

        requests.put(
            records_pb2.ConsumeRequest(
                text=True,
                credit_records=10,
                positions=[
                    records_pb2.ConsumePosition(topic=topic, partition=1, offset=0),
                    records_pb2.ConsumePosition(topic=topic, partition=11, offset=999),
                ],
            )
        )
        responses = stub.Consume(stream(), timeout=60)
        errors: list[tuple[int, int]] = []
        got: list[tuple[int, str]] = []
        while not (errors and got):
            response = next(responses)
            errors.extend((e.partition, e.error.code) for e in response.errors)
            got.extend((r.partition, r.value_text) for r in response.records)
        assert errors == [(11, common_pb2.OFFSET_OUT_OF_RANGE)]
        assert got == [(1, "one")]
        requests.put(None)
        responses.cancel()
