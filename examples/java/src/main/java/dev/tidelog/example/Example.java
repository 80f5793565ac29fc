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
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import tidelog.v1.AdminOuterClass.CreateTopicsRequest;
import tidelog.v1.AdminOuterClass.NewTopic;
import tidelog.v1.AdminOuterClass.TopicResult;
import tidelog.v1.Common.ErrorCode;
import tidelog.v1.RecordsOuterClass.Acks;
import tidelog.v1.RecordsOuterClass.ConsumePosition;
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
 * (tidelog.v1.Records) and consumes them back, checking that every key, value and header
 * arrived. It uses nothing but the Java code generated from protos/tidelog/v1 (see pom.xml).
 *
 * <pre>java -jar target/tidelog-java-example.jar --gateway 127.0.0.1:9395 --topic java-example --records 1000</pre>
 *
 * <p>Exits 0 and prints one line when every record came back intact, else exits 1 naming what
 * was wrong.
 */
public final class Example {
  /** Records per Produce request; requests are pipelined. */
  private static final int RECORDS_PER_REQUEST = 100;

  public static void main(String[] args) throws Exception {
    Map<String, String> opts = new HashMap<>(Map.of(
        "--gateway", "127.0.0.1:9395", "--topic", "java-example",
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
      run(channel, opts.get("--topic"), Integer.parseInt(opts.get("--partitions")),
          Integer.parseInt(opts.get("--records")), deadline);
    } catch (Exception e) {
      System.err.println("java example: " + e.getMessage());
      System.exit(1);
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  static void run(ManagedChannel channel, String topic, int partitions, int n, long timeoutS)
      throws Exception {
    createTopic(channel, topic, partitions, timeoutS);
    CallOptions options = CallOptions.DEFAULT.withDeadlineAfter(timeoutS, TimeUnit.SECONDS);
    List<RecordResult> written = produce(channel, options, topic, n, timeoutS);
    // Read back from where this run's records start in each partition.
    Map<Integer, Long> start = new HashMap<>();
    for (RecordResult r : written) {
      start.merge(r.getPartition(), r.getOffset(), Math::min);
    }
    List<ConsumedRecord> got = consume(channel, options, topic, start, n, timeoutS);
    check(got, n);
    System.out.printf(
        "java example: produced and consumed %d records in %d partitions, keys, values and headers intact%n",
        n, start.size());
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
   * Reads the given partitions from the given offsets with exactly n records of credit and
   * closes its side at once: the gateway ends the stream when the credit is spent.
   */
  static List<ConsumedRecord> consume(ManagedChannel channel, CallOptions options, String topic,
      Map<Integer, Long> start, int n, long timeoutS) throws Exception {
    List<ConsumedRecord> got = new ArrayList<>();
    CompletableFuture<Void> done = new CompletableFuture<>();
    StreamObserver<ConsumeRequest> requests = ClientCalls.asyncBidiStreamingCall(
        channel.newCall(Calls.CONSUME, options), new StreamObserver<>() {
      @Override
      public void onNext(ConsumeResponse resp) {
        for (PartitionError e : resp.getErrorsList()) {
          done.completeExceptionally(new IllegalStateException("Consume: " + e.getTopic() + "-"
              + e.getPartition() + ": " + e.getError().getCode() + ": " + e.getError().getMessage()));
        }
        got.addAll(resp.getRecordsList());
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
    var req = ConsumeRequest.newBuilder().setCreditRecords(n);
    start.forEach((p, off) -> req.addPositions(
        ConsumePosition.newBuilder().setTopic(topic).setPartition(p).setOffset(off)));
    requests.onNext(req.build());
    requests.onCompleted();
    done.get(timeoutS, TimeUnit.SECONDS);
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
