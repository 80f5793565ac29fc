package main

// The batch-level path: records encoded by batch.go and produced with
// tidelog.v1.Log/Produce (the service the brokers speak; the gateway passes
// the bytes through untouched), and the `encode` command the byte-identity
// test uses.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	pb "tidelogexamples/tidelog/v1"
)

const acksAll = -1

// produceBatches writes n records with Log.Produce, one batch per partition
// per request (record i goes to partition i % partitions), and returns where
// each partition's records start. A partition whose broker does not lead it
// (yet: right after the topic was created, brokers pick it up from etcd) gets
// the same batch again after a pause, as Kafka's producers do; any other
// error ends the run.
func produceBatches(ctx context.Context, client pb.LogClient, topic string, partitions int32, n int) (map[int32]int64, error) {
	stream, err := client.Produce(ctx)
	if err != nil {
		return nil, err
	}
	start := map[int32]int64{}
	corr := int64(0)
	for first := 0; first < n; first += recordsPerRequest {
		byPartition := map[int32][]BatchRecord{}
		for i := first; i < min(first+recordsPerRequest, n); i++ {
			p := int32(i) % partitions
			byPartition[p] = append(byPartition[p], BatchRecord{
				Key:         []byte(key(i)),
				Value:       []byte(value(i)),
				Headers:     []Header{{"seq", []byte(strconv.Itoa(i))}, {"client", []byte("go")}},
				TimestampMs: 1_700_000_000_000 + int64(i),
			})
		}
		pending := map[int32][]byte{}
		for p, records := range byPartition {
			batch, err := EncodeBatch(records)
			if err != nil {
				return nil, err
			}
			pending[p] = batch
		}
		for attempt := 0; len(pending) > 0; attempt++ {
			if attempt > 0 {
				if err := pause(ctx, attempt); err != nil {
					return nil, fmt.Errorf("Log.Produce: partitions still not writable: %w", err)
				}
			}
			req := &pb.ProduceRequest{CorrelationId: corr, Acks: acksAll}
			corr++
			for p, batch := range pending {
				req.Partitions = append(req.Partitions, &pb.PartitionRecords{Topic: topic, Partition: p, Records: batch})
			}
			if err := stream.Send(req); err != nil {
				return nil, fmt.Errorf("Log.Produce: %w", err)
			}
			resp, err := stream.Recv()
			if err != nil {
				return nil, fmt.Errorf("Log.Produce: %w", err)
			}
			for _, r := range resp.Partitions {
				if r.Error != nil && r.Error.Code != pb.ErrorCode_NONE {
					if retriable(r.Error.Code) {
						continue // still pending: sent again
					}
					return nil, fmt.Errorf("Log.Produce %s-%d: %s: %s", r.Topic, r.Partition, r.Error.Code, r.Error.Message)
				}
				delete(pending, r.Partition)
				if off, ok := start[r.Partition]; !ok || r.BaseOffset < off {
					start[r.Partition] = r.BaseOffset
				}
			}
		}
	}
	return start, stream.CloseSend()
}

// retriable reports the partition errors after which sending the same batch
// again cannot write it twice: the broker refused it before appending. (A
// timeout of acks=all is not one, nor NOT_ENOUGH_REPLICAS_AFTER_APPEND: the
// batch may be in the log; only an idempotent producer may send it again.)
func retriable(code pb.ErrorCode) bool {
	return code == pb.ErrorCode_NOT_LEADER_OR_FOLLOWER || code == pb.ErrorCode_UNKNOWN_TOPIC_OR_PARTITION
}

// pause waits before the attempt-th retry: 50 ms, doubling, at most 1 s,
// or until ctx ends (its deadline bounds the retries).
func pause(ctx context.Context, attempt int) error {
	wait := min(50*time.Millisecond<<min(attempt-1, 5), time.Second)
	select {
	case <-time.After(wait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// encodeCommand reads {"batches": [[record, ...], ...]} as JSON on stdin
// (record: {"key", "value": base64 or null, "headers": [{"key", "value"}],
// "timestamp_ms"}) and writes the encoded batches, back to back, to stdout.
func encodeCommand(in io.Reader, out io.Writer) error {
	var input struct {
		Batches [][]struct {
			Key         []byte `json:"key"`
			Value       []byte `json:"value"`
			TimestampMs int64  `json:"timestamp_ms"`
			Headers     []struct {
				Key   string `json:"key"`
				Value []byte `json:"value"`
			} `json:"headers"`
		} `json:"batches"`
	}
	if err := json.NewDecoder(in).Decode(&input); err != nil {
		return fmt.Errorf("encode: reading the records: %w", err)
	}
	for _, batch := range input.Batches {
		records := make([]BatchRecord, len(batch))
		for i, r := range batch {
			records[i] = BatchRecord{Key: r.Key, Value: r.Value, TimestampMs: r.TimestampMs}
			for _, h := range r.Headers {
				records[i].Headers = append(records[i].Headers, Header{h.Key, h.Value})
			}
		}
		encoded, err := EncodeBatch(records)
		if err != nil {
			return err
		}
		if _, err := out.Write(encoded); err != nil {
			return err
		}
	}
	return nil
}

func encodeMain() {
	if err := encodeCommand(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "go example:", err)
		os.Exit(1)
	}
}
