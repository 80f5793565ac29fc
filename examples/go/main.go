// Command tidelog-go-example produces N keyed records with headers through a
// Tidelog gateway's record-level API (tidelog.v1.Records) and consumes them
// back as a member of a consumer group, committing as it goes, checking that
// every key, value and header arrived. It uses nothing but the Go code
// generated from protos/tidelog/v1 (see build.sh).
//
//	tidelog-go-example -gateway 127.0.0.1:9395 -topic go-example -group go-example -records 1000
//
// The group starts from its committed offsets: records of the topic that are
// older than this run's (a previous run's, not committed) are read, committed
// and skipped.
//
// With -api log it produces through the batch-level tidelog.v1.Log service
// instead, with the record-batch encoder of batch.go (written from
// docs/record-batch.md), and reads back through Records as before.
// `tidelog-go-example encode` only encodes batches (see logapi.go);
// `tidelog-go-example produce` produces for a while and prints which records
// were acknowledged (see produce.go); `tidelog-go-example bench` measures the
// record-level API's throughput (see bench.go); `tidelog-go-example
// commit-bench` members' offset commits through a coordinator (see
// commitbench.go) and `tidelog-go-example echo-bench` a bare gRPC echo
// server (see echobench.go), for bench/group_bench.py.
//
// It exits 0 and prints one line when every record came back intact, else it
// exits 1 naming what was wrong.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "tidelogexamples/tidelog/v1"
)

// recordsPerRequest: records per Produce request; requests are pipelined.
const recordsPerRequest = 100

func main() {
	if len(os.Args) > 1 && os.Args[1] == "encode" {
		encodeMain()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "produce" {
		produceMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "bench" {
		benchMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "commit-bench" {
		commitBenchMain(os.Args[2:])
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "echo-bench" {
		echoBenchMain(os.Args[2:])
		return
	}
	api := flag.String("api", "records", "produce with the record-level Records service or the batch-level Log service (records|log)")
	gateway := flag.String("gateway", "127.0.0.1:9395", "the gateway's address (tidelog dev prints it)")
	topic := flag.String("topic", "go-example", "topic to create (if missing), write and read")
	partitions := flag.Int("partitions", 3, "partitions of the topic when it is created")
	group := flag.String("group", "go-example", "consumer group to consume in (it commits as it goes)")
	records := flag.Int("records", 1000, "records to produce and consume")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole run")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if *api != "records" && *api != "log" {
		fmt.Fprintf(os.Stderr, "go example: -api %q: records or log\n", *api)
		os.Exit(2)
	}
	if err := run(ctx, *api, *gateway, *topic, *group, int32(*partitions), *records); err != nil {
		fmt.Fprintln(os.Stderr, "go example:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, api, gateway, topic, group string, partitions int32, n int) error {
	conn, err := grpc.NewClient(gateway, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := createTopic(ctx, pb.NewAdminClient(conn), topic, partitions); err != nil {
		return err
	}
	records := pb.NewRecordsClient(conn)
	// Remember where this run's records start in each partition, so that
	// the check counts exactly what this run wrote.
	var start map[int32]int64
	if api == "log" {
		if start, err = produceBatches(ctx, pb.NewLogClient(conn), topic, partitions, n); err != nil {
			return err
		}
	} else {
		written, err := produce(ctx, records, topic, n)
		if err != nil {
			return err
		}
		start = map[int32]int64{}
		for _, r := range written {
			if off, ok := start[r.Partition]; !ok || r.Offset < off {
				start[r.Partition] = r.Offset
			}
		}
	}
	got, err := consumeInGroup(ctx, records, topic, group, start, n)
	if err != nil {
		return err
	}
	if err := check(got, n); err != nil {
		return err
	}
	fmt.Printf("go example (%s): produced and consumed %d records in %d partitions in group %s, committed; keys, values and headers intact\n", api, n, len(start), group)
	return nil
}

func createTopic(ctx context.Context, admin pb.AdminClient, topic string, partitions int32) error {
	resp, err := admin.CreateTopics(ctx, &pb.CreateTopicsRequest{
		Topics: []*pb.NewTopic{{Name: topic, Partitions: partitions}},
	})
	if err != nil {
		return fmt.Errorf("CreateTopics: %w", err)
	}
	for _, t := range resp.Topics {
		if t.Error != nil && t.Error.Code != pb.ErrorCode_TOPIC_ALREADY_EXISTS {
			return fmt.Errorf("CreateTopics %s: %s: %s", t.Name, t.Error.Code, t.Error.Message)
		}
	}
	return nil
}

func key(i int) string   { return "key-" + strconv.Itoa(i) }
func value(i int) string { return "value-" + strconv.Itoa(i) }

// produce sends every request without waiting (the stream is pipelined),
// then reads one response per request, in order.
func produce(ctx context.Context, client pb.RecordsClient, topic string, n int) ([]*pb.RecordResult, error) {
	stream, err := client.Produce(ctx)
	if err != nil {
		return nil, err
	}
	sendErr := make(chan error, 1)
	go func() {
		for first := 0; first < n; first += recordsPerRequest {
			req := &pb.RecordsProduceRequest{CorrelationId: int64(first), Acks: pb.Acks_ACKS_ALL}
			for i := first; i < min(first+recordsPerRequest, n); i++ {
				req.Records = append(req.Records, &pb.ProduceRecord{
					Topic:     topic,
					KeyKind:   &pb.ProduceRecord_Key{Key: []byte(key(i))},
					ValueKind: &pb.ProduceRecord_Value{Value: []byte(value(i))},
					Headers: []*pb.RecordHeader{
						{Key: "seq", Value: []byte(strconv.Itoa(i))},
						{Key: "client", Value: []byte("go")},
					},
				})
			}
			if err := stream.Send(req); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	var results []*pb.RecordResult
	for next := 0; next < n; next += recordsPerRequest {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("Produce: %w", err)
		}
		if resp.CorrelationId != int64(next) {
			return nil, fmt.Errorf("Produce: answer %d came where %d was expected", resp.CorrelationId, next)
		}
		for _, r := range resp.Results {
			if r.Error != nil && r.Error.Code != pb.ErrorCode_NONE {
				return nil, fmt.Errorf("Produce: %s-%d: %s: %s", r.Topic, r.Partition, r.Error.Code, r.Error.Message)
			}
		}
		results = append(results, resp.Results...)
	}
	if err := <-sendErr; err != nil {
		return nil, fmt.Errorf("Produce: %w", err)
	}
	if len(results) != n {
		return nil, fmt.Errorf("Produce: %d results for %d records", len(results), n)
	}
	return results, nil
}

// consumeWindow: records of credit the consumer keeps granted; it grants
// more as it processes what came.
const consumeWindow = 500

// consumeInGroup reads the topic as one member of the group: the gateway
// joins the group for the stream's lifetime, tells the stream which
// partitions it owns (assignment responses) and starts each from the group's
// committed offset. Each response's records are processed (kept for the
// check), then committed on the same stream, then replaced by as much credit:
// at-least-once, since a record is committed only after it was processed.
// It returns this run's n records (those at or after start[partition]) once
// they have all come and every commit is answered; cancelling the stream
// then makes the member leave the group.
func consumeInGroup(ctx context.Context, client pb.RecordsClient, topic, group string, start map[int32]int64, n int) ([]*pb.ConsumedRecord, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream: the member leaves the group
	stream, err := client.Consume(ctx)
	if err != nil {
		return nil, err
	}
	err = stream.Send(&pb.ConsumeRequest{
		CreditRecords: consumeWindow,
		Group:         &pb.ConsumeGroup{GroupId: group, Topics: []string{topic}},
	})
	if err != nil {
		return nil, err
	}
	owned := map[int32]bool{}
	var got []*pb.ConsumedRecord
	sent, answered := int64(0), int64(0)
	for len(got) < n || answered < sent {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("Consume in group %s (%d of %d records, %d of %d commits answered): %w", group, len(got), n, answered, sent, err)
		}
		for _, e := range resp.Errors {
			return nil, fmt.Errorf("Consume: %s-%d: %s: %s", e.Topic, e.Partition, e.Error.Code, e.Error.Message)
		}
		if a := resp.GetAssignment(); a != nil {
			clear(owned)
			for _, tp := range a.Owned {
				owned[tp.Partition] = true
			}
			continue
		}
		if c := resp.GetCommit(); c != nil {
			if c.Error != nil && c.Error.Code != pb.ErrorCode_NONE {
				return nil, fmt.Errorf("commit %d: %s: %s", c.CorrelationId, c.Error.Code, c.Error.Message)
			}
			answered++
			continue
		}
		if len(resp.Records) == 0 {
			continue
		}
		// Process: keep this run's records (older ones are skipped, and committed all the same).
		next := map[int32]int64{}
		for _, r := range resp.Records {
			if !owned[r.Partition] {
				return nil, fmt.Errorf("record of %s-%d, a partition the stream does not own", r.Topic, r.Partition)
			}
			if off, ok := start[r.Partition]; ok && r.Offset >= off {
				got = append(got, r)
			}
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		}
		// Then commit what was processed, and grant as much credit again.
		sent++
		commit := &pb.ConsumeCommit{CorrelationId: sent}
		for p, off := range next {
			commit.Offsets = append(commit.Offsets, &pb.OffsetCommit{Topic: topic, Partition: p, Offset: off})
		}
		err = stream.Send(&pb.ConsumeRequest{Commit: commit, CreditRecords: int64(len(resp.Records))})
		if err != nil {
			return nil, fmt.Errorf("Consume: sending commit %d: %w", sent, err)
		}
	}
	return got, nil
}

// check: each of the n records exactly once, with its value and headers.
func check(got []*pb.ConsumedRecord, n int) error {
	if len(got) != n {
		return fmt.Errorf("consumed %d records, produced %d", len(got), n)
	}
	seen := make([]bool, n)
	for _, r := range got {
		k := string(r.GetKey())
		var i int
		if _, err := fmt.Sscanf(k, "key-%d", &i); err != nil || i < 0 || i >= n || key(i) != k {
			return fmt.Errorf("unexpected key %q at %s-%d@%d", k, r.Topic, r.Partition, r.Offset)
		}
		if seen[i] {
			return fmt.Errorf("key %q consumed twice", k)
		}
		seen[i] = true
		if v := string(r.GetValue()); v != value(i) {
			return fmt.Errorf("key %q: value %q, want %q", k, v, value(i))
		}
		if len(r.Headers) != 2 || r.Headers[0].Key != "seq" || string(r.Headers[0].Value) != strconv.Itoa(i) ||
			r.Headers[1].Key != "client" || string(r.Headers[1].Value) != "go" {
			return fmt.Errorf("key %q: headers %v, want seq=%d client=go", k, r.Headers, i)
		}
	}
	return nil
}
