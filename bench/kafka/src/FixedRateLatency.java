/*
 * Fixed-rate end-to-end latency for the Tidelog Kafka baseline (bench/kafka_baseline.py).
 *
 * Kafka's own org.apache.kafka.tools.EndToEndLatency sends one record, waits until it is
 * consumed, then sends the next: it measures an idle round trip, at no fixed rate. This
 * program instead produces at a fixed rate and consumes in the same JVM, so both ends share
 * System.nanoTime():
 *
 *   - a consumer thread assigns every partition of the topic, seeks to the end and signals;
 *   - the producer sends record i at start + i / rate (parking until then), with the record's
 *     sequence number, its scheduled time and its actual send time in the first 24 bytes;
 *   - latency of a record = time the consumer's poll returned it - its send time.
 *     The "co_" (coordinated-omission corrected) figures use the scheduled time instead, so a
 *     producer that falls behind its schedule shows up as latency rather than being hidden.
 *
 * The first `warmup` records (JIT, connection setup, metadata) are sent and consumed but not
 * counted. Output: one JSON object on stdout.
 *
 * With role=consumer or role=producer the program plays one side only, so that producer and
 * consumer can run in two JVMs (System.nanoTime() is CLOCK_MONOTONIC on Linux: one clock for
 * every process of the machine). The consumer prints "ready" once it is at the end of the
 * topic, then the latency JSON when it has every record; the producer prints the send-side
 * JSON (sent, achieved_rate, send_errors, max_behind_ms).
 *
 * Usage: FixedRateLatency BOOTSTRAP TOPIC NUM_RECORDS RECORD_SIZE RATE_PER_S ACKS WARMUP
 *        [role=both|producer|consumer] [key=value producer/consumer properties ...]
 *        (properties prefixed "producer." or "consumer.")
 */

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class FixedRateLatency {
    private static final int HEADER = 24;

    public static void main(String[] args) throws Exception {
        if (args.length < 7) {
            System.err.println("usage: FixedRateLatency BOOTSTRAP TOPIC NUM_RECORDS RECORD_SIZE"
                    + " RATE_PER_S ACKS WARMUP [producer.k=v|consumer.k=v ...]");
            System.exit(2);
        }
        final String bootstrap = args[0];
        final String topic = args[1];
        final int measured = Integer.parseInt(args[2]);
        final int recordSize = Math.max(HEADER, Integer.parseInt(args[3]));
        final double rate = Double.parseDouble(args[4]);
        final String acks = args[5];
        final int warmup = Integer.parseInt(args[6]);
        final int total = warmup + measured;

        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("acks", acks);
        pp.put("linger.ms", "0");
        pp.put("key.serializer", ByteArraySerializer.class.getName());
        pp.put("value.serializer", ByteArraySerializer.class.getName());
        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("enable.auto.commit", "false");
        cp.put("auto.offset.reset", "latest");
        cp.put("fetch.min.bytes", "1");
        cp.put("key.deserializer", ByteArrayDeserializer.class.getName());
        cp.put("value.deserializer", ByteArrayDeserializer.class.getName());
        String role = "both";
        for (int i = 7; i < args.length; i++) {
            String a = args[i];
            int eq = a.indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("bad property: " + a);
            String k = a.substring(0, eq), v = a.substring(eq + 1);
            if (k.equals("role")) {
                if (!v.equals("both") && !v.equals("producer") && !v.equals("consumer")) {
                    throw new IllegalArgumentException("role must be both, producer or consumer: " + v);
                }
                role = v;
            } else if (k.startsWith("producer.")) pp.put(k.substring(9), v);
            else if (k.startsWith("consumer.")) cp.put(k.substring(9), v);
            else throw new IllegalArgumentException("property needs producer./consumer. prefix: " + a);
        }

        final long[] sendLat = new long[total];
        final long[] schedLat = new long[total];
        Arrays.fill(sendLat, -1L);
        final AtomicLong received = new AtomicLong();
        final AtomicLong duplicates = new AtomicLong();
        final CountDownLatch ready = new CountDownLatch(1);
        final CountDownLatch done = new CountDownLatch(1);
        final Throwable[] consumerError = new Throwable[1];
        final double nsPerRecord = 1e9 / rate;
        // A consumer of its own JVM also waits for the producer's JVM to start.
        final long deadlineNs = System.nanoTime()
                + (long) (total * nsPerRecord) + TimeUnit.SECONDS.toNanos(role.equals("consumer") ? 120 : 60);
        final boolean produce = !role.equals("consumer");
        final boolean consume = !role.equals("producer");

        Thread consumerThread = new Thread(() -> {
            try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp)) {
                List<TopicPartition> tps = new ArrayList<>();
                for (PartitionInfo pi : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                    tps.add(new TopicPartition(pi.topic(), pi.partition()));
                }
                consumer.assign(tps);
                consumer.seekToEnd(tps);
                for (TopicPartition tp : tps) consumer.position(tp, Duration.ofSeconds(30));
                ready.countDown();
                long got = 0;
                while (got < total && System.nanoTime() < deadlineNs) {
                    ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(100));
                    long now = System.nanoTime();
                    for (ConsumerRecord<byte[], byte[]> r : recs) {
                        ByteBuffer b = ByteBuffer.wrap(r.value());
                        int seq = (int) b.getLong();
                        long sched = b.getLong();
                        long sent = b.getLong();
                        if (seq < 0 || seq >= total) continue;
                        if (sendLat[seq] >= 0) {
                            duplicates.incrementAndGet();
                            continue;
                        }
                        sendLat[seq] = now - sent;
                        schedLat[seq] = now - sched;
                        got++;
                    }
                    received.set(got);
                }
            } catch (Throwable t) {
                consumerError[0] = t;
                ready.countDown();
            } finally {
                done.countDown();
            }
        }, "latency-consumer");
        consumerThread.setDaemon(true);
        if (consume) {
            consumerThread.start();
            if (!ready.await(60, TimeUnit.SECONDS)) throw new IllegalStateException("consumer not ready");
            if (consumerError[0] != null) throw new RuntimeException(consumerError[0]);
        }
        if (!produce) {
            System.out.println("ready");
            System.out.flush();
        }

        final AtomicLong sendErrors = new AtomicLong();
        long behindMax = 0;
        long startNs = 0;
        long endSendNs = 0;
        if (produce) try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            producer.partitionsFor(topic); // metadata before the clock starts
            startNs = System.nanoTime();
            for (int i = 0; i < total; i++) {
                long sched = startNs + (long) (i * nsPerRecord);
                long now = System.nanoTime();
                // Park, never spin: a spinning client would take a core from the broker on a
                // small machine. Timer slack makes a send up to ~0.1 ms late; records that are
                // due by then go out back to back, each stamped with its own scheduled time.
                while (now < sched) {
                    LockSupport.parkNanos(sched - now);
                    now = System.nanoTime();
                }
                behindMax = Math.max(behindMax, now - sched);
                byte[] v = new byte[recordSize];
                ByteBuffer b = ByteBuffer.wrap(v);
                b.putLong(i);
                b.putLong(sched);
                b.putLong(System.nanoTime());
                producer.send(new ProducerRecord<>(topic, v), (md, ex) -> {
                    if (ex != null) sendErrors.incrementAndGet();
                });
            }
            endSendNs = System.nanoTime();
            producer.flush();
        }
        double sendSeconds = (endSendNs - startNs) / 1e9;
        if (!consume) {
            System.out.println("{\"sent\":" + total + ",\"warmup\":" + warmup
                    + ",\"send_errors\":" + sendErrors.get() + ",\"target_rate\":" + rate
                    + ",\"achieved_rate\":" + (sendSeconds > 0 ? (total - 1) / sendSeconds : 0)
                    + ",\"max_behind_ms\":" + behindMax / 1e6 + "}");
            System.out.flush();
            System.exit(sendErrors.get() == 0 ? 0 : 3);
        }
        done.await(Math.max(1, deadlineNs - System.nanoTime()), TimeUnit.NANOSECONDS);
        if (consumerError[0] != null) throw new RuntimeException(consumerError[0]);

        long[] lat = new long[measured];
        long[] co = new long[measured];
        int n = 0;
        double sum = 0;
        for (int i = warmup; i < total; i++) {
            if (sendLat[i] < 0) continue;
            lat[n] = sendLat[i];
            co[n] = schedLat[i];
            sum += sendLat[i];
            n++;
        }
        lat = Arrays.copyOf(lat, n);
        co = Arrays.copyOf(co, n);
        Arrays.sort(lat);
        Arrays.sort(co);
        StringBuilder sb = new StringBuilder("{");
        sb.append("\"sent\":").append(total);
        sb.append(",\"warmup\":").append(warmup);
        sb.append(",\"measured\":").append(n);
        sb.append(",\"lost\":").append(measured - n);
        sb.append(",\"duplicates\":").append(duplicates.get());
        sb.append(",\"send_errors\":").append(sendErrors.get());
        sb.append(",\"target_rate\":").append(rate);
        sb.append(",\"achieved_rate\":").append(sendSeconds > 0 ? (total - 1) / sendSeconds : 0);
        sb.append(",\"max_behind_ms\":").append(behindMax / 1e6);
        sb.append(",\"mean_ms\":").append(n > 0 ? sum / n / 1e6 : -1);
        sb.append(",\"p50_ms\":").append(pct(lat, 50.0));
        sb.append(",\"p99_ms\":").append(pct(lat, 99.0));
        sb.append(",\"p999_ms\":").append(pct(lat, 99.9));
        sb.append(",\"max_ms\":").append(n > 0 ? lat[n - 1] / 1e6 : -1);
        sb.append(",\"co_p50_ms\":").append(pct(co, 50.0));
        sb.append(",\"co_p99_ms\":").append(pct(co, 99.0));
        sb.append(",\"co_p999_ms\":").append(pct(co, 99.9));
        sb.append("}");
        System.out.println(sb);
        System.out.flush();
        System.exit(n == measured && sendErrors.get() == 0 ? 0 : 3);
    }

    /** Nearest-rank percentile of a sorted array, in milliseconds; -1 when empty. */
    private static double pct(long[] sorted, double p) {
        if (sorted.length == 0) return -1;
        int rank = (int) Math.ceil(p / 100.0 * sorted.length);
        int idx = Math.min(sorted.length - 1, Math.max(0, rank - 1));
        return sorted[idx] / 1e6;
    }
}
