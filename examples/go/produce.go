// `tidelog-go-example produce`: produce through the gateway's Records API for
// a while and say which records were acknowledged, one line each on stdout:
//
//	acked <partition> <offset> <seq>
//	failed <seq> <error code>
//	done acked=<n> failed=<n> unanswered=<n>
//
// Record <seq> has key "key-<seq>" and value "value-<seq>". A record is
// acknowledged when its result carries an offset and no error; with -acks all
// the gateway answers only once every in-sync replica has it. A fault test
// (tests/fault/test_gateway_go_failover.py) SIGKILLs brokers meanwhile and
// then checks that every acknowledged record can be read at its offset.
//
// Requests are pipelined (at most -in-flight unanswered). Should the stream
// itself break, the records of unanswered requests count as unanswered (not
// acknowledged) and a new stream carries on with the next records.
package main

import (
	"bufio"
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

func produceMain(args []string) {
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	gateway := fs.String("gateway", "127.0.0.1:9395", "the gateway's address")
	topic := fs.String("topic", "go-example", "topic to write (must exist)")
	duration := fs.Duration("duration", 10*time.Second, "how long to keep producing")
	perRequest := fs.Int("records-per-request", 50, "records per Produce request")
	inFlight := fs.Int("in-flight", 4, "most requests awaiting their answer")
	pause := fs.Duration("pause", 5*time.Millisecond, "pause between requests")
	acks := fs.String("acks", "all", "all, leader or none")
	timeout := fs.Duration("timeout", 3*time.Minute, "deadline for the whole run")
	_ = fs.Parse(args)
	level, ok := map[string]pb.Acks{"all": pb.Acks_ACKS_ALL, "leader": pb.Acks_ACKS_LEADER, "none": pb.Acks_ACKS_NONE}[*acks]
	if !ok {
		fmt.Fprintf(os.Stderr, "go example produce: -acks %q: all, leader or none\n", *acks)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := grpc.NewClient(*gateway, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "go example produce:", err)
		os.Exit(1)
	}
	defer conn.Close()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	p := &ackedProducer{
		client: pb.NewRecordsClient(conn), topic: *topic, acks: level, out: out,
		perRequest: *perRequest, inFlight: *inFlight, pause: *pause,
	}
	p.run(ctx, time.Now().Add(*duration))
	fmt.Fprintf(out, "done acked=%d failed=%d unanswered=%d\n", p.acked, p.failed, p.unanswered)
}

type ackedProducer struct {
	client                    pb.RecordsClient
	topic                     string
	acks                      pb.Acks
	out                       *bufio.Writer
	perRequest, inFlight      int
	pause                     time.Duration
	next                      int // seq of the next record to send
	acked, failed, unanswered int
}

// run opens streams until the deadline has passed and the last one is done.
func (p *ackedProducer) run(ctx context.Context, until time.Time) {
	for time.Now().Before(until) && ctx.Err() == nil {
		if err := p.stream(ctx, until); err != nil {
			fmt.Fprintln(os.Stderr, "go example produce: stream broke, opening another:", err)
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// stream sends requests on one Produce stream until the deadline, then
// reads the remaining answers. Each answer is printed as it comes.
func (p *ackedProducer) stream(ctx context.Context, until time.Time) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.client.Produce(ctx)
	if err != nil {
		return err
	}
	// Requests in flight are bounded by slots; sent carries each request's
	// first seq, in order, to the loop below that reads the answers.
	slots := make(chan struct{}, p.inFlight)
	sent := make(chan int, p.inFlight)
	sendErr := make(chan error, 1)
	go func() {
		defer close(sent)
		for time.Now().Before(until) {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			first := p.next
			req := &pb.RecordsProduceRequest{CorrelationId: int64(first), Acks: p.acks}
			for i := first; i < first+p.perRequest; i++ {
				req.Records = append(req.Records, &pb.ProduceRecord{
					Topic:     p.topic,
					KeyKind:   &pb.ProduceRecord_Key{Key: []byte(key(i))},
					ValueKind: &pb.ProduceRecord_Value{Value: []byte(value(i))},
				})
			}
			p.next += p.perRequest
			sent <- first
			if err := stream.Send(req); err != nil {
				sendErr <- err
				return
			}
			time.Sleep(p.pause)
		}
		sendErr <- stream.CloseSend()
	}()
	for first := range sent {
		if err := p.answer(stream, first); err != nil {
			p.unanswered += p.perRequest
			cancel()
			for range sent {
				p.unanswered += p.perRequest
			}
			return err
		}
		<-slots
	}
	return <-sendErr
}

// answer reads the answer to the request whose first record is `first`.
func (p *ackedProducer) answer(stream pb.Records_ProduceClient, first int) error {
	resp, err := stream.Recv()
	if err != nil {
		return err
	}
	if resp.CorrelationId != int64(first) {
		return fmt.Errorf("answer %d came where %d was expected", resp.CorrelationId, first)
	}
	for i, r := range resp.Results {
		seq := first + i
		if r.Error != nil && r.Error.Code != pb.ErrorCode_NONE {
			p.failed++
			fmt.Fprintf(p.out, "failed %d %s\n", seq, r.Error.Code)
			continue
		}
		p.acked++
		fmt.Fprintf(p.out, "acked %d %d %s\n", r.Partition, r.Offset, strconv.Itoa(seq))
	}
	return nil
}
