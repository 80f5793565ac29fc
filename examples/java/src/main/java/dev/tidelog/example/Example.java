package dev.tidelog.example;

import com.google.protobuf.ByteString;
import io.grpc.CallOptions;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.stub.ClientCalls;
import io.grpc.stub.StreamObserver;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import tidelog.v1.AdminOuterClass.CreateTopicsRequest;
import tidelog.v1.AdminOuterClass.NewTopic;
import tidelog.v1.AdminOuterClass.TopicResult;
import tidelog.v1.Common.ErrorCode;
import tidelog.v1.Common.TopicPartition;
import tidelog.v1.GroupOuterClass.OffsetCommit;
import tidelog.v1.RecordsOuterClass.Acks;
import tidelog.v1.RecordsOuterClass.CommitResult;
import tidelog.v1.RecordsOuterClass.ConsumeCommit;
import tidelog.v1.RecordsOuterClass.ConsumeGroup;
import tidelog.v1.RecordsOuterClass.ConsumeRequest;
import tidelog.v1.RecordsOuterClass.ConsumeResponse;
import tidelog.v1.RecordsOuterClass.ConsumedRecord;
import tidelog.v1.RecordsOuterClass.PartitionError;
import tidelog.v1.RecordsOuterClass.ProduceRecord;
import tidelog.v1.RecordsOuterClass.RecordHeader;
import tidelog.v1.RecordsOuterClass.RecordResult;
import tidelog.v1.RecordsOuterClass.RecordsProduceRequest;
import tidelog.v1.RecordsOuterClass.RecordsProduceResponse;

/**
 * Produces N keyed records with headers through a Tidelog gateway's record-level API
 * (tidelog.v1.Records) and consumes them back as a member of a consumer group, committing as
 * it goes, checking that every key, value and header arrived. It uses nothing but the Java
 * code generated from protos/tidelog/v1 (see pom.xml).
 *
 * <pre>java -jar target/tidelog-java-example.jar --gateway 127.0.0.1:9395 --topic java-example --group java-example --records 1000</pre>
 *
 * <p>The group starts from its committed offsets: records of the topic older than this run's
 * (a previous run's, not committed) are read, committed and skipped.
 *
 * <p>Exits 0 and prints one line when every record came back intact, else exits 1 naming what
 * was wrong.
 */
public final class Example {
  /** Records per Produce request; requests are pipelined. */
  private static final int RECORDS_PER_REQUEST = 100;
  /** Records of credit the consumer keeps granted; it grants more as it processes. */
  private static final int CONSUME_WINDOW = 500;

  public static void main(String[] args) throws Exception {
    Map<String, String> opts = new HashMap<>(Map.of(
        "--gateway", "127.0.0.1:9395", "--topic", "java-example", "--group", "java-example",
        "--partitions", "3", "--records", "1000", "--timeout-s", "60"));
    for (int i = 0; i + 1 < args.length; i += 2) {
      if (!opts.containsKey(args[i])) {
        System.err.println("java example: unknown option " + args[i] + "; options: " + opts.keySet());
        System.exit(2);
      }
      opts.put(args[i], args[i + 1]);
    }
    ManagedChannel channel =
        ManagedChannelBuilder.forTarget(opts.get("--gateway")).usePlaintext().build();
    try {
      long deadline = Long.parseLong(opts.get("--timeout-s"));
      run(channel, opts.get("--topic"), opts.get("--group"), Integer.parseInt(opts.get("--partitions")),
          Integer.parseInt(opts.get("--records")), deadline);
    } catch (Exception e) {
      System.err.println("java example: " + e.getMessage());
      System.exit(1);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  static void run(ManagedChannel channel, String topic, String group, int partitions, int n, long timeoutS)
      throws Exception {
    createTopic(channel, topic, partitions, timeoutS);
    CallOptions options = CallOptions.DEFAULT.withDeadlineAfter(timeoutS, TimeUnit.SECONDS);
    List<RecordResult> written = produce(channel, options, topic, n, timeoutS);
    // Where this run's records start in each partition: the check counts exactly those.
    Map<Integer, Long> start = new HashMap<>();
    for (RecordResult r : written) {
      start.merge(r.getPartition(), r.getOffset(), Math::min);
    }
    List<ConsumedRecord> got = consumeInGroup(channel, options, topic, group, start, n, timeoutS);
    check(got, n);
    System.out.printf("java example: produced and consumed %d records in %d partitions in group %s,"
        + " committed; keys, values and headers intact%n", n, start.size(), group);
  }

  static void createTopic(ManagedChannel channel, String topic, int partitions, long timeoutS) {
    var resp = ClientCalls.blockingUnaryCall(channel, Calls.CREATE_TOPICS,
        CallOptions.DEFAULT.withDeadlineAfter(timeoutS, TimeUnit.SECONDS),
        CreateTopicsRequest.newBuilder()
            .addTopics(NewTopic.newBuilder().setName(topic).setPartitions(partitions))
            .build());
    for (TopicResult t : resp.getTopicsList()) {
      ErrorCode code = t.getError().getCode();
      if (code != ErrorCode.NONE && code != ErrorCode.TOPIC_ALREADY_EXISTS) {
        throw new IllegalStateException(
            "CreateTopics " + t.getName() + ": " + code + ": " + t.getError().getMessage());
      }
    }
  }

  static String key(int i) {
    return "key-" + i;
  }

  static String value(int i) {
    return "value-" + i;
  }

  static ByteString utf8(String s) {
    return ByteString.copyFrom(s, StandardCharsets.UTF_8);
  }

  /** Sends every request without waiting (the stream is pipelined); one answer per request. */
  static List<RecordResult> produce(
      ManagedChannel channel, CallOptions options, String topic, int n, long timeoutS)
      throws Exception {
    List<RecordResult> results = new ArrayList<>();
    CompletableFuture<Void> done = new CompletableFuture<>();
    StreamObserver<RecordsProduceRequest> requests = ClientCalls.asyncBidiStreamingCall(
        channel.newCall(Calls.PRODUCE, options), new StreamObserver<>() {
      long expected = 0;

      @Override
      public void onNext(RecordsProduceResponse resp) {
        if (resp.getCorrelationId() != expected) {
          done.completeExceptionally(new IllegalStateException(
              "Produce: answer " + resp.getCorrelationId() + " came where " + expected + " was expected"));
        }
        expected += RECORDS_PER_REQUEST;
        for (RecordResult r : resp.getResultsList()) {
          if (r.getError().getCode() != ErrorCode.NONE) {
            done.completeExceptionally(new IllegalStateException("Produce: " + r.getTopic() + "-"
                + r.getPartition() + ": " + r.getError().getCode() + ": " + r.getError().getMessage()));
          }
        }
        results.addAll(resp.getResultsList());
      }

      @Override
      public void onError(Throwable t) {
        done.completeExceptionally(t);
      }

      @Override
      public void onCompleted() {
        done.complete(null);
      }
    });
    for (int first = 0; first < n; first += RECORDS_PER_REQUEST) {
      var req = RecordsProduceRequest.newBuilder().setCorrelationId(first).setAcks(Acks.ACKS_ALL);
      for (int i = first; i < Math.min(first + RECORDS_PER_REQUEST, n); i++) {
        req.addRecords(ProduceRecord.newBuilder()
            .setTopic(topic)
            .setKey(utf8(key(i)))
            .setValue(utf8(value(i)))
            .addHeaders(RecordHeader.newBuilder().setKey("seq").setValue(utf8(Integer.toString(i))))
            .addHeaders(RecordHeader.newBuilder().setKey("client").setValue(utf8("java"))));
      }
      requests.onNext(req.build());
    }
    requests.onCompleted();
    done.get(timeoutS, TimeUnit.SECONDS);
    if (results.size() != n) {
      throw new IllegalStateException("Produce: " + results.size() + " results for " + n + " records");
    }
    return results;
  }

  /**
   * Reads the topic as one member of the group: the gateway joins the group for the stream's
   * lifetime, tells the stream which partitions it owns (assignment responses) and starts each
   * from the group's committed offset. Each response's records are processed (kept for the
   * check), then committed on the same stream, then replaced by as much credit: at-least-once,
   * since a record is committed only after it was processed. Returns this run's n records (those
   * at or after start[partition]) once they have all come and every commit is answered;
   * cancelling the stream then makes the member leave the group.
   */
  static List<ConsumedRecord> consumeInGroup(ManagedChannel channel, CallOptions options,
      String topic, String group, Map<Integer, Long> start, int n, long timeoutS) throws Exception {
    // Responses (or the stream's end: a Throwable, or END) handed to this thread, which
    // processes them and sends the commits.
    BlockingQueue<Object> inbox = new LinkedBlockingQueue<>();
    Object end = new Object();
    StreamObserver<ConsumeRequest> requests = ClientCalls.asyncBidiStreamingCall(
        channel.newCall(Calls.CONSUME, options), new StreamObserver<ConsumeResponse>() {
      @Override
      public void onNext(ConsumeResponse resp) {
        inbox.add(resp);
      }

      @Override
      public void onError(Throwable t) {
        inbox.add(t);
      }

      @Override
      public void onCompleted() {
        inbox.add(end);
      }
    });
    List<ConsumedRecord> got = new ArrayList<>();
    Set<Integer> owned = new java.util.HashSet<>();
    long sent = 0;
    long answered = 0;
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(timeoutS);
    try {
      requests.onNext(ConsumeRequest.newBuilder().setCreditRecords(CONSUME_WINDOW)
          .setGroup(ConsumeGroup.newBuilder().setGroupId(group).addTopics(topic)).build());
      while (got.size() < n || answered < sent) {
        Object next = inbox.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
        String progress = " (" + got.size() + " of " + n + " records, " + answered + " of " + sent
            + " commits answered)";
        if (next == null || next == end) {
          throw new IllegalStateException("Consume in group " + group
              + (next == null ? ": timed out" : ": the stream ended") + progress);
        }
        if (next instanceof Throwable t) {
          throw new IllegalStateException("Consume in group " + group + ": " + t + progress, t);
        }
        ConsumeResponse resp = (ConsumeResponse) next;
        for (PartitionError e : resp.getErrorsList()) {
          throw new IllegalStateException("Consume: " + e.getTopic() + "-" + e.getPartition() + ": "
              + e.getError().getCode() + ": " + e.getError().getMessage());
        }
        if (resp.hasAssignment()) {
          owned.clear();
          for (TopicPartition tp : resp.getAssignment().getOwnedList()) {
            owned.add(tp.getPartition());
          }
          continue;
        }
        if (resp.hasCommit()) {
          CommitResult c = resp.getCommit();
          if (c.getError().getCode() != ErrorCode.NONE) {
            throw new IllegalStateException("commit " + c.getCorrelationId() + ": "
                + c.getError().getCode() + ": " + c.getError().getMessage());
          }
          answered++;
          continue;
        }
        if (resp.getRecordsCount() == 0) {
          continue;
        }
        // Process: keep this run's records (older ones are skipped, and committed all the same).
        Map<Integer, Long> nextOffsets = new HashMap<>();
        for (ConsumedRecord r : resp.getRecordsList()) {
          if (!owned.contains(r.getPartition())) {
            throw new IllegalStateException("record of " + r.getTopic() + "-" + r.getPartition()
                + ", a partition the stream does not own");
          }
          Long from = start.get(r.getPartition());
          if (from != null && r.getOffset() >= from) {
            got.add(r);
          }
          nextOffsets.merge(r.getPartition(), r.getOffset() + 1, Math::max);
        }
        // Then commit what was processed, and grant as much credit again.
        var commit = ConsumeCommit.newBuilder().setCorrelationId(++sent);
        nextOffsets.forEach((p, off) -> commit.addOffsets(
            OffsetCommit.newBuilder().setTopic(topic).setPartition(p).setOffset(off)));
        requests.onNext(ConsumeRequest.newBuilder().setCommit(commit)
            .setCreditRecords(resp.getRecordsCount()).build());
      }
    } finally {
      // Ends the stream: the member leaves the group.
      requests.onError(io.grpc.Status.CANCELLED.withDescription("done").asRuntimeException());
    }
    return got;
  }

  /** Each of the n records exactly once, with its value and headers. */
  static void check(List<ConsumedRecord> got, int n) {
    if (got.size() != n) {
      throw new IllegalStateException("consumed " + got.size() + " records, produced " + n);
    }
    boolean[] seen = new boolean[n];
    for (ConsumedRecord r : got) {
      String k = r.getKey().toStringUtf8();
      int i;
      try {
        i = Integer.parseInt(k.substring("key-".length()));
      } catch (RuntimeException e) {
        i = -1;
      }
      if (i < 0 || i >= n || !key(i).equals(k)) {
        throw new IllegalStateException("unexpected key " + k + " at " + r.getTopic() + "-"
            + r.getPartition() + "@" + r.getOffset());
      }
      if (seen[i]) {
        throw new IllegalStateException("key " + k + " consumed twice");
      }
      seen[i] = true;
      if (!r.getValue().toStringUtf8().equals(value(i))) {
        throw new IllegalStateException("key " + k + ": value " + r.getValue().toStringUtf8());
      }
      List<RecordHeader> h = r.getHeadersList();
      if (h.size() != 2 || !h.get(0).getKey().equals("seq")
          || !h.get(0).getValue().toStringUtf8().equals(Integer.toString(i))
          || !h.get(1).getKey().equals("client") || !h.get(1).getValue().toStringUtf8().equals("java")) {
        throw new IllegalStateException("key " + k + ": headers " + h + ", want seq=" + i + " client=java");
      }
    }
  }
}
