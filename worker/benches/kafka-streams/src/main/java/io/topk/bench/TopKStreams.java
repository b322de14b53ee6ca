package io.topk.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * Per-scope Top-K over a sliding (hopping) window, the way a Kafka Streams user would build it:
 * count each key in every window with a RocksDB window store, hold each window's counts until
 * it closes (suppression), then rank each (scope, window) in a RocksDB key-value store, with
 * exactly-once processing. Output: one record per (scope, window end), keyed
 * {@code scope@endMillis}, valued {@code key\tcount} lines in rank order (count descending,
 * then key ascending, as topk ranks); later records for a key replace earlier ones.
 *
 * <p>The input is keyed by topk's message key {@code metric|scope|key}, so every event of a
 * (scope, key) is already in one partition and counting groups by the record key without a
 * repartition. Event time is the record timestamp, which the producer sets to the event time.
 *
 * <p>Arguments: bootstrap input output applicationId stateDir metric k windowMs advanceMs graceMs.
 * Prints {@code FIRST unixMillis} when the first record is read.
 */
public final class TopKStreams {
  private TopKStreams() {}

  public static void main(String[] args) throws InterruptedException {
    Properties props = properties("TopKStreams", args);
    String input = args[1];
    String output = args[2];
    String metric = args[5];
    int k = Integer.parseInt(args[6]);
    Duration window = Duration.ofMillis(Long.parseLong(args[7]));
    Duration advance = Duration.ofMillis(Long.parseLong(args[8]));
    Duration grace = Duration.ofMillis(Long.parseLong(args[9]));

    ObjectMapper json = new ObjectMapper();
    AtomicBoolean first = new AtomicBoolean(true);
    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .peek((key, value) -> reportFirst(first))
        .filter((key, value) -> isCounted(json, value, metric))
        .groupByKey()
        .windowedBy(TimeWindows.ofSizeAndGrace(window, grace).advanceBy(advance))
        .count()
        .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
        .toStream()
        .map(
            (windowed, count) -> {
              String[] parts = windowed.key().split("\\|", 3);
              return KeyValue.pair(
                  parts[1] + "@" + windowed.window().end(), new KeyCount(parts[2], count));
            })
        .groupByKey(Grouped.with(Serdes.String(), KeyCount.SERDE))
        .aggregate(
            TopList::new,
            (scopeEnd, keyCount, list) -> list.add(keyCount, k),
            Materialized.<String, TopList, KeyValueStore<Bytes, byte[]>>as("rankings")
                .withKeySerde(Serdes.String())
                .withValueSerde(TopList.SERDE))
        .toStream()
        .mapValues(TopList::render)
        .to(output, Produced.with(Serdes.String(), Serdes.String()));
    run(builder.build(), props);
  }

  /**
   * The settings of either application from its arguments (bootstrap input output
   * applicationId stateDir metric k windowMs advanceMs graceMs); exits on a wrong count.
   */
  static Properties properties(String name, String[] args) {
    if (args.length != 10) {
      System.err.println(
          "usage: "
              + name
              + " bootstrap input output applicationId stateDir metric k windowMs advanceMs graceMs");
      System.exit(2);
    }
    Properties props = new Properties();
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[3]);
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // The test broker has one node.
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
    // Tuned as a production user would: commits (and cache flushes) every second, as often as
    // the topk worker checkpoints in the benchmark, instead of exactly-once's 100 ms; a record
    // cache that holds every open window's counts instead of 10 MiB, so that updates to hot keys
    // are combined in memory before they reach RocksDB and the changelogs.
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 512L * 1024 * 1024);
    return props;
  }

  /** Runs a topology until the process is stopped. */
  static void run(Topology topology, Properties props) throws InterruptedException {
    KafkaStreams streams = new KafkaStreams(topology, props);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  streams.close(Duration.ofSeconds(30));
                  stopped.countDown();
                }));
    streams.setUncaughtExceptionHandler(
        e -> {
          e.printStackTrace();
          return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
              .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
    streams.start();
    stopped.await();
  }

  static void reportFirst(AtomicBoolean first) {
    if (first.compareAndSet(true, false)) {
      System.out.println("FIRST " + System.currentTimeMillis());
      System.out.flush();
    }
  }

  /** Whether a payload is a well-formed event of {@code metric} (malformed ones are skipped). */
  static boolean isCounted(ObjectMapper json, String payload, String metric) {
    try {
      JsonNode event = json.readTree(payload);
      return event != null
          && metric.equals(event.path("metric").asText())
          && event.path("scope").isTextual()
          && event.path("key").isTextual()
          && event.path("event_time").canConvertToLong();
    } catch (IOException e) {
      return false;
    }
  }

  /** One key's final count in one window. */
  record KeyCount(String key, long count) {
    static final Serde<KeyCount> SERDE =
        Serdes.serdeFrom(
            (Serializer<KeyCount>)
                (topic, kc) -> {
                  byte[] key = kc.key.getBytes(java.nio.charset.StandardCharsets.UTF_8);
                  return ByteBuffer.allocate(8 + 4 + key.length)
                      .putLong(kc.count)
                      .putInt(key.length)
                      .put(key)
                      .array();
                },
            (Deserializer<KeyCount>)
                (topic, bytes) -> {
                  ByteBuffer buf = ByteBuffer.wrap(bytes);
                  long count = buf.getLong();
                  byte[] key = new byte[buf.getInt()];
                  buf.get(key);
                  return new KeyCount(new String(key, java.nio.charset.StandardCharsets.UTF_8), count);
                });

    /** Rank order: count descending, then key ascending. */
    boolean before(KeyCount other) {
      return count != other.count ? count > other.count : key.compareTo(other.key) < 0;
    }
  }

  /** The best {@code k} keys of a (scope, window), in rank order. */
  static final class TopList {
    final List<KeyCount> items = new ArrayList<>();

    TopList add(KeyCount kc, int k) {
      int at = items.size();
      while (at > 0 && kc.before(items.get(at - 1))) {
        at--;
      }
      if (at < k) {
        items.add(at, kc);
        if (items.size() > k) {
          items.remove(items.size() - 1);
        }
      }
      return this;
    }

    String render() {
      StringBuilder out = new StringBuilder();
      for (KeyCount kc : items) {
        out.append(kc.key).append('\t').append(kc.count).append('\n');
      }
      return out.toString();
    }

    static final Serde<TopList> SERDE =
        Serdes.serdeFrom(
            (Serializer<TopList>)
                (topic, list) -> {
                  ByteArrayOutputStream bytes = new ByteArrayOutputStream();
                  try (DataOutputStream out = new DataOutputStream(bytes)) {
                    out.writeInt(list.items.size());
                    for (KeyCount kc : list.items) {
                      out.writeUTF(kc.key);
                      out.writeLong(kc.count);
                    }
                  } catch (IOException e) {
                    throw new UncheckedIOException(e);
                  }
                  return bytes.toByteArray();
                },
            (Deserializer<TopList>)
                (topic, bytes) -> {
                  TopList list = new TopList();
                  try (DataInputStream in =
                      new DataInputStream(new java.io.ByteArrayInputStream(bytes))) {
                    int n = in.readInt();
                    for (int i = 0; i < n; i++) {
                      list.items.add(new KeyCount(in.readUTF(), in.readLong()));
                    }
                  } catch (IOException e) {
                    throw new UncheckedIOException(e);
                  }
                  return list;
                });
  }
}
