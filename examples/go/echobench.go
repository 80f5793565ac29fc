// `tidelog-go-example echo-bench`: a Go client of bench/group_bench.py's
// bare grpc.aio streaming echo server (method /bench.Echo/EchoStream, raw
// bytes, no protobuf), driven as that bench's Python stream client drives
// it: one stream, -in-flight requests of 60 bytes awaiting their answer,
// one request per message; the server answers every request it has read
// in one message of one byte per request. For -seconds; then it prints
//
//	{"requests": N, "elapsed_s": ...}
//
// What the Python gRPC server side can do when the client is not the
// bottleneck.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// rawCodec passes messages as bytes, untouched. Named "proto" so that the
// content type is the usual application/grpc+proto (grpc.aio's generic
// handlers take any bytes).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func echoBenchMain(args []string) {
	fs := flag.NewFlagSet("echo-bench", flag.ExitOnError)
	address := fs.String("address", "127.0.0.1:0", "the echo server's address")
	seconds := fs.Float64("seconds", 3, "how long to send")
	inFlight := fs.Int("in-flight", 64, "requests awaiting their answer")
	_ = fs.Parse(args)
	requests, elapsed, err := echoBench(*address, *inFlight, time.Duration(*seconds*float64(time.Second)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "go echo-bench:", err)
		os.Exit(1)
	}
	line, _ := json.Marshal(map[string]any{"requests": requests, "elapsed_s": elapsed})
	fmt.Println(string(line))
}

func echoBench(address string, inFlight int, duration time.Duration) (int, float64, error) {
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), duration+time.Minute)
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/bench.Echo/EchoStream", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return 0, 0, err
	}
	slots := make(chan struct{}, inFlight)
	answered := make(chan int, 1)
	readErr := make(chan error, 1)
	go func() {
		done := 0
		for {
			var answer []byte
			if err := stream.RecvMsg(&answer); err != nil {
				answered <- done
				if err != io.EOF {
					readErr <- err
				}
				close(readErr)
				return
			}
			done += len(answer)
			for range answer {
				<-slots
			}
		}
	}()
	request := make([]byte, 60)
	for i := range request {
		request[i] = 'x'
	}
	began := time.Now()
	deadline := began.Add(duration)
	for time.Now().Before(deadline) {
		slots <- struct{}{}
		if err := stream.SendMsg(&request); err != nil {
			break // the reader reports why
		}
	}
	if err := stream.CloseSend(); err != nil {
		return 0, 0, err
	}
	done := <-answered
	elapsed := time.Since(began).Seconds()
	if err := <-readErr; err != nil {
		return 0, 0, err
	}
	return done, elapsed, nil
}
