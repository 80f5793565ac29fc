// `tidelog-go-example bench`: the record-level API's throughput from a Go
// client, as bench/gateway_bench.py runs it:
//
//	tidelog-go-example bench -gateway 127.0.0.1:9395 -topic go-bench -records 200000 -size 100
//
// It creates the topic, produces -records records of -size bytes (no key,
// acks=leader) on one pipelined Produce stream, then consumes them back on
// one Consume stream from the partitions' first offsets of this run, and
// prints one JSON line:
//
//	{"records": N, "record_bytes": 100, "produce_records_per_s": ..., "consume_records_per_s": ...}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "tidelogexamples/tidelog/v1"
)

func benchMain(args []string) {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	gateway := fs.String("gateway", "127.0.0.1:9395", "the gateway's address")
	topic := fs.String("topic", "go-bench", "topic to create (if missing), write and read")
	partitions := fs.Int("partitions", 3, "partitions of the topic when it is created")
	n := fs.Int("records", 200_000, "records to produce and consume")
	size := fs.Int("size", 100, "bytes of each record's value")
	perRequest := fs.Int("records-per-request", 1000, "records per Produce request")
	inFlight := fs.Int("in-flight", 16, "most Produce requests awaiting their answer")
	credit := fs.Int("credit", 50_000, "records of credit the consumer keeps granted")
	timeout := fs.Duration("timeout", 5*time.Minute, "deadline for the whole run")
	produceOnly := fs.Bool("produce-only", false, "produce only (consume_records_per_s is then 0)")
	keyed := fs.Bool("keyed", false, "give each record a key (key-0 .. key-<records-per-request - 1>)")
	_ = fs.Parse(args)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := bench(ctx, *gateway, *topic, int32(*partitions), *n, *size, *perRequest, *inFlight, *credit, *produceOnly, *keyed); err != nil {
		fmt.Fprintln(os.Stderr, "go example bench:", err)
		os.Exit(1)
	}
}

func bench(ctx context.Context, gateway, topic string, partitions int32, n, size, perRequest, inFlight, credit int, produceOnly, keyed bool) error {
	conn, err := grpc.NewClient(gateway,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := createTopic(ctx, pb.NewAdminClient(conn), topic, partitions); err != nil {
		return err
	}
	records := pb.NewRecordsClient(conn)
	began := time.Now()
	start, err := benchProduce(ctx, records, topic, n, size, perRequest, inFlight, keyed)
	if err != nil {
		return err
	}
	produceS := time.Since(began).Seconds()
	consumeRate := 0.0
	if !produceOnly {
		began = time.Now()
		if err := benchConsume(ctx, records, topic, start, n, credit); err != nil {
			return err
		}
		consumeRate = float64(n) / time.Since(began).Seconds()
	}
	line, _ := json.Marshal(map[string]any{
		"records":               n,
		"record_bytes":          size,
		"produce_records_per_s": float64(n) / produceS,
		"consume_records_per_s": consumeRate,
	})
	fmt.Println(string(line))
	return nil
}

// benchProduce writes n records and returns, per partition, the first offset
// written.
func benchProduce(ctx context.Context, client pb.RecordsClient, topic string, n, size, perRequest, inFlight int, keyed bool) (map[int32]int64, error) {
	stream, err := client.Produce(ctx)
	if err != nil {
		return nil, err
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = 'v'
	}
	// One request's records, reused: the records are the same each time.
	template := make([]*pb.ProduceRecord, perRequest)
	for i := range template {
		template[i] = &pb.ProduceRecord{Topic: topic, ValueKind: &pb.ProduceRecord_Value{Value: payload}}
		if keyed {
			template[i].KeyKind = &pb.ProduceRecord_Key{Key: []byte(fmt.Sprintf("key-%d", i))}
		}
	}
	slots := make(chan struct{}, inFlight)
	sendErr := make(chan error, 1)
	requests := (n + perRequest - 1) / perRequest
	go func() {
		for r := 0; r < requests; r++ {
			slots <- struct{}{}
			count := min(perRequest, n-r*perRequest)
			req := &pb.RecordsProduceRequest{CorrelationId: int64(r), Acks: pb.Acks_ACKS_LEADER, Records: template[:count]}
			if err := stream.Send(req); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- stream.CloseSend()
	}()
	start := map[int32]int64{}
	for r := 0; r < requests; r++ {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("Produce: %w", err)
		}
		for _, res := range resp.Results {
			if res.Error != nil && res.Error.Code != pb.ErrorCode_NONE {
				return nil, fmt.Errorf("Produce: %s-%d: %s: %s", res.Topic, res.Partition, res.Error.Code, res.Error.Message)
			}
			if off, ok := start[res.Partition]; !ok || res.Offset < off {
				start[res.Partition] = res.Offset
			}
		}
		<-slots
	}
	return start, <-sendErr
}

// benchConsume reads n records from the given starting offsets, keeping
// `credit` records granted.
func benchConsume(ctx context.Context, client pb.RecordsClient, topic string, start map[int32]int64, n, credit int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Consume(ctx)
	if err != nil {
		return err
	}
	first := &pb.ConsumeRequest{CreditRecords: int64(credit)}
	for p, off := range start {
		first.Positions = append(first.Positions, &pb.ConsumePosition{
			Topic: topic, Partition: p, Start: &pb.ConsumePosition_Offset{Offset: off},
		})
	}
	return consumeN(stream, first, n)
}

func consumeN(stream pb.Records_ConsumeClient, first *pb.ConsumeRequest, n int) error {
	if err := stream.Send(first); err != nil {
		return err
	}
	got := 0
	for got < n {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("Consume (%d of %d records): %w", got, n, err)
		}
		for _, e := range resp.Errors {
			return fmt.Errorf("Consume: %s-%d: %s: %s", e.Topic, e.Partition, e.Error.Code, e.Error.Message)
		}
		got += len(resp.Records)
		if len(resp.Records) > 0 {
			if err := stream.Send(&pb.ConsumeRequest{CreditRecords: int64(len(resp.Records))}); err != nil {
				return err
			}
		}
	}
	return nil
}
