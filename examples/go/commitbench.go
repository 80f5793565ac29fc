// `tidelog-go-example commit-bench`: members' offset commits through a
// coordinator's CommitOffsetsStream, driven from Go, as bench/group_bench.py
// runs it (beside its Python clients, so that the coordinator is measured
// with a load generator that is not itself the bottleneck):
//
//	tidelog-go-example commit-bench -coordinator 127.0.0.1:9190 -topic commits \
//	    -partitions 1 -members 64 -in-flight 64 -seconds 3
//
// It joins -members members, one group each (group <-group-prefix><i>),
// through the Group Heartbeat stream, keeps each heartbeating at the
// interval the coordinator answers and acknowledges every assignment, and
// waits until each member owns partitions 0 .. -partitions - 1 of the topic.
// Then it prints "ready" and waits for a line on stdin (so that the caller
// measures the coordinator over the commits only), and for -seconds commits
// on one CommitOffsetsStream, as the SDK does (one stream per client
// process): -in-flight committers, committer i commits as member i mod
// -members, each one commit at a time, every commit -partitions partitions
// at the member's next offset (1, 2, ...) with the member's id, epoch and
// token. Every commit that one answer message makes ready goes out in one
// request message, as the SDK's consumers' do. Then it prints one JSON line
// (requests answered, partitions committed by those answered without error,
// the time from the first commit to the last answer, answers with an error):
//
//	{"requests": N, "partition_offsets": N*P, "elapsed_s": ..., "errors": 0}
//
// and the members leave. When an answer had an error, or the stream failed,
// it exits 1 naming the first.
//
// With -in-flight equal to -members (the default), each member has one
// commit in flight at a time, so each group's committed offset of each
// partition is the number of commits its member made.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "tidelogexamples/tidelog/v1"
)

// commitsPerMessageMax: the coordinator's limit of commits in one stream message
// (COMMITS_PER_MESSAGE_MAX in services/coordinator/tidelog_coordinator/commit_stream.py).
const commitsPerMessageMax = 1024

func commitBenchMain(args []string) {
	fs := flag.NewFlagSet("commit-bench", flag.ExitOnError)
	coordinator := fs.String("coordinator", "127.0.0.1:9190", "the coordinator's (or gateway's) address")
	topic := fs.String("topic", "commits", "topic the members subscribe to (it must exist)")
	partitions := fs.Int("partitions", 1, "partitions committed by each request (0 .. P-1)")
	members := fs.Int("members", 64, "members, one group each")
	groupPrefix := fs.String("group-prefix", "go-commit-", "groups are named <prefix><i>")
	seconds := fs.Float64("seconds", 3, "how long to commit")
	inFlight := fs.Int("in-flight", 0, "commits in flight on the stream (default: -members)")
	handshake := fs.Bool("handshake", true, `print "ready" once joined and wait for a line on stdin`)
	timeout := fs.Duration("timeout", 5*time.Minute, "deadline for the whole run")
	_ = fs.Parse(args)
	if *inFlight == 0 {
		*inFlight = *members
	}
	if *members < 1 || *partitions < 1 || *inFlight < 1 {
		fmt.Fprintln(os.Stderr, "go commit-bench: -members, -partitions and -in-flight must be at least 1")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	err := commitBench(ctx, *coordinator, *topic, *groupPrefix, int32(*partitions), *members, *inFlight,
		time.Duration(*seconds*float64(time.Second)), *handshake)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go commit-bench:", err)
		os.Exit(1)
	}
}

type commitBenchResult struct {
	Requests         int64   `json:"requests"`
	PartitionOffsets int64   `json:"partition_offsets"`
	ElapsedS         float64 `json:"elapsed_s"`
	Errors           int64   `json:"errors"`
}

func commitBench(ctx context.Context, address, topic, groupPrefix string, partitions int32, members, inFlight int,
	duration time.Duration, handshake bool) error {
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	group := pb.NewGroupClient(conn)

	joined := make([]*member, members)
	defer func() {
		for _, m := range joined {
			if m != nil {
				m.leave(group)
			}
		}
	}()
	for i := range joined {
		if joined[i], err = join(ctx, group, fmt.Sprintf("%s%d", groupPrefix, i), topic); err != nil {
			return err
		}
	}
	for _, m := range joined {
		if err := m.waitOwning(ctx, topic, partitions); err != nil {
			return err
		}
	}
	if handshake {
		fmt.Println("ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return fmt.Errorf("waiting for the go-ahead on stdin: %w", err)
		}
	}

	stream, err := group.CommitOffsetsStream(ctx)
	if err != nil {
		return err
	}
	result, runErr := commitFor(stream, joined, topic, partitions, inFlight, duration)
	// Printed before the members leave (deferred above), so that a caller
	// measuring the coordinator until this line counts the commits only.
	line, _ := json.Marshal(result)
	fmt.Println(string(line))
	return runErr
}

// commitFor commits on the stream for `duration`: `inFlight` committers,
// committer c as member c mod len(members), each one commit at a time.
// Answers drive it, as they drive the SDK's consumers: every commit that an
// answer message makes ready goes out in one request message (the SDK's
// writer sends every commit that became ready while it was writing, and an
// answer message wakes all its committers at once). A writer goroutine
// sends; this goroutine reads the answers and matches them to committers
// by correlation id (they come in any order). It returns once every commit
// was answered and the coordinator ended the stream (the client having
// closed its side); an error when an answer had one or the stream failed.
func commitFor(stream pb.Group_CommitOffsetsStreamClient, members []*member, topic string, partitions int32,
	inFlight int, duration time.Duration) (*commitBenchResult, error) {
	result := &commitBenchResult{}
	offsets := make([]int64, len(members)) // each member's last offset committed
	committerOf := map[uint64]int{}        // correlation id in flight -> committer
	nextID := uint64(0)
	next := func(c int) *pb.StreamedCommit {
		i := c % len(members)
		m := members[i]
		offsets[i]++
		request := &pb.CommitOffsetsRequest{
			GroupId: m.groupID, MemberId: m.id, MemberEpoch: m.epoch.Load(), MemberToken: m.token,
			Offsets: make([]*pb.OffsetCommit, partitions),
		}
		for p := range partitions {
			request.Offsets[p] = &pb.OffsetCommit{Topic: topic, Partition: p, Offset: offsets[i]}
		}
		nextID++
		committerOf[nextID] = c
		return &pb.StreamedCommit{CorrelationId: nextID, Commit: request}
	}

	outbox := make(chan []*pb.StreamedCommit, inFlight+1)
	writeErr := make(chan error, 1)
	go writeCommits(stream, outbox, writeErr)

	began := time.Now()
	deadline := began.Add(duration)
	first := make([]*pb.StreamedCommit, inFlight)
	for c := range inFlight {
		first[c] = next(c)
	}
	outbox <- first
	var firstErr error
	for len(committerOf) > 0 {
		message, err := stream.Recv()
		if err != nil {
			firstErr = fmt.Errorf("the commit stream ended with %d commits unanswered: %w", len(committerOf), err)
			break
		}
		more := time.Now().Before(deadline)
		var ready []*pb.StreamedCommit
		for _, a := range message.Answers {
			c, ok := committerOf[a.CorrelationId]
			if !ok {
				return result, fmt.Errorf("an answer to correlation id %d, not in flight", a.CorrelationId)
			}
			delete(committerOf, a.CorrelationId)
			result.Requests++
			if a.Error != nil && a.Error.Code != pb.ErrorCode_NONE {
				result.Errors++
				if firstErr == nil {
					firstErr = fmt.Errorf("commit of group %s: %s: %s", members[c%len(members)].groupID, a.Error.Code, a.Error.Message)
				}
				continue
			}
			result.PartitionOffsets += int64(partitions)
			if more {
				ready = append(ready, next(c))
			}
		}
		if len(ready) > 0 {
			outbox <- ready
		}
	}
	result.ElapsedS = time.Since(began).Seconds()
	close(outbox)
	if err := <-writeErr; err != nil && firstErr == nil {
		firstErr = fmt.Errorf("writing commits: %w", err)
	}
	if firstErr == nil {
		// The client closed its side: the coordinator ends the stream.
		if _, err := stream.Recv(); err != io.EOF {
			firstErr = fmt.Errorf("the commit stream did not end cleanly: %v", err)
		}
	}
	if firstErr != nil {
		return result, fmt.Errorf("%d of %d commits answered with an error, or the stream failed; the first: %w", result.Errors, result.Requests, firstErr)
	}
	return result, nil
}

// writeCommits sends the commits handed to it, every batch queued while it
// was writing the message before in the next message (at most
// commitsPerMessageMax commits each); it closes the client's side once the
// outbox is closed.
func writeCommits(stream pb.Group_CommitOffsetsStreamClient, outbox <-chan []*pb.StreamedCommit, done chan<- error) {
	var pending []*pb.StreamedCommit
	for batch := range outbox {
		pending = append(pending, batch...)
	more:
		for {
			select {
			case b, ok := <-outbox:
				if !ok {
					break more
				}
				pending = append(pending, b...)
			default:
				break more
			}
		}
		for len(pending) > 0 {
			n := min(len(pending), commitsPerMessageMax)
			if err := stream.Send(&pb.CommitOffsetsStreamRequest{Commits: pending[:n]}); err != nil {
				// The reader learns why from Recv; keep the outbox from filling.
				done <- err
				for range outbox {
				}
				return
			}
			pending = pending[n:]
		}
	}
	done <- stream.CloseSend()
}

// ---------------------------------------------------------------- members

// member: one group member's session on its Heartbeat stream.
type member struct {
	groupID string
	id      string
	token   string
	epoch   atomic.Int32
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when owned or failure changes
	owned    map[string]map[int32]bool
	failure  error
	interval time.Duration
}

// join opens the member's Heartbeat stream, sends the join and reads the
// first answer (the member id and token); a goroutine then keeps the
// session: a heartbeat every interval, an ack for every assignment.
func join(ctx context.Context, group pb.GroupClient, groupID, topic string) (*member, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := group.Heartbeat(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	err = stream.Send(&pb.GroupHeartbeatRequest{
		GroupId:          groupID,
		SubscribedTopics: []string{topic},
		SessionTimeoutMs: 60_000,
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("joining %s: %w", groupID, err)
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, fmt.Errorf("joining %s: %w", groupID, err)
	}
	if first.Error != nil && first.Error.Code != pb.ErrorCode_NONE {
		cancel()
		return nil, fmt.Errorf("joining %s: %s: %s", groupID, first.Error.Code, first.Error.Message)
	}
	m := &member{
		groupID: groupID, id: first.MemberId, token: first.MemberToken, cancel: cancel,
		done: make(chan struct{}), changed: make(chan struct{}), owned: map[string]map[int32]bool{},
		interval: 20 * time.Second, // a third of the session until the coordinator says
	}
	// Requests go out from one goroutine (a stream takes one Send at a time).
	outbox := make(chan *pb.GroupHeartbeatRequest, 16)
	go m.send(stream, outbox)
	go m.receive(stream, first, outbox)
	return m, nil
}

func (m *member) send(stream pb.Group_HeartbeatClient, outbox <-chan *pb.GroupHeartbeatRequest) {
	for {
		m.mu.Lock()
		interval := m.interval
		m.mu.Unlock()
		var request *pb.GroupHeartbeatRequest
		select {
		case <-m.done:
			return
		case request = <-outbox:
		case <-time.After(interval):
			request = &pb.GroupHeartbeatRequest{}
		}
		if err := stream.Send(request); err != nil {
			m.fail(fmt.Errorf("heartbeat of %s: %w", m.groupID, err))
			return
		}
	}
}

func (m *member) receive(stream pb.Group_HeartbeatClient, response *pb.GroupHeartbeatResponse, outbox chan<- *pb.GroupHeartbeatRequest) {
	defer close(m.done)
	for {
		if response.Error != nil && response.Error.Code != pb.ErrorCode_NONE {
			m.fail(fmt.Errorf("session of %s ended: %s: %s", m.groupID, response.Error.Code, response.Error.Message))
			return
		}
		m.epoch.Store(response.MemberEpoch)
		m.mu.Lock()
		if ms := response.HeartbeatIntervalMs; ms > 0 {
			m.interval = time.Duration(ms) * time.Millisecond
		}
		m.mu.Unlock()
		if a := response.Assignment; a != nil {
			owned := map[string]map[int32]bool{}
			ack := &pb.AssignmentAck{MemberEpoch: response.MemberEpoch}
			for _, tp := range a.Partitions {
				if owned[tp.Topic] == nil {
					owned[tp.Topic] = map[int32]bool{}
				}
				owned[tp.Topic][tp.Partition] = true
				ack.Owned = append(ack.Owned, tp)
			}
			m.mu.Lock()
			m.owned = owned
			m.notifyLocked()
			m.mu.Unlock()
			outbox <- &pb.GroupHeartbeatRequest{Ack: ack}
		}
		var err error
		if response, err = stream.Recv(); err != nil {
			m.fail(fmt.Errorf("session of %s ended: %w", m.groupID, err))
			return
		}
	}
}

func (m *member) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failure == nil {
		m.failure = err
		m.notifyLocked()
	}
}

func (m *member) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// waitOwning returns once the member owns partitions 0 .. partitions-1 of
// the topic (the coordinator fences commits of partitions a member does not own).
func (m *member) waitOwning(ctx context.Context, topic string, partitions int32) error {
	for {
		m.mu.Lock()
		failure, changed := m.failure, m.changed
		covered := true
		for p := int32(0); p < partitions; p++ {
			covered = covered && m.owned[topic][p]
		}
		m.mu.Unlock()
		if failure != nil {
			return failure
		}
		if covered {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("member of %s waiting for partitions 0..%d of %s: %w", m.groupID, partitions-1, topic, ctx.Err())
		}
	}
}

// leave ends the session at once (the partitions move now, not after the
// session timeout).
func (m *member) leave(group pb.GroupClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := group.LeaveGroup(ctx, &pb.LeaveGroupRequest{GroupId: m.groupID, MemberId: m.id, MemberToken: m.token})
	if err != nil {
		fmt.Fprintf(os.Stderr, "go commit-bench: leaving %s: %v\n", m.groupID, err)
	}
	m.cancel()
	<-m.done
}
