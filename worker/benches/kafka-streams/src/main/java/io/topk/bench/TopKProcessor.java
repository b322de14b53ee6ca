package io.topk.bench;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.topk.bench.TopKStreams.KeyCount;
import io.topk.bench.TopKStreams.TopList;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * The same per-scope Top-K as {@link TopKStreams}, hand-written with the Processor API the way
 * topk counts: each task counts its partition's events per (bucket, scope, key) in one RocksDB
 * key-value store (one update per event instead of one per hopping window), and when its stream
 * time passes a window end plus the grace, sums the window's buckets by a range scan, ranks each
 * scope's keys and forwards its partition's top {@code k}; buckets no later window needs are
 * deleted. A second processor, after a repartition by (scope, window end), merges the
 * partitions' lists (keys are disjoint across partitions, so the merge is exact), as topk's
 * reducer merges its shards' summaries. Exactly-once v2, output as {@link TopKStreams}'.
 *
 * <p>Arguments as {@link TopKStreams}'.
 */
public final class TopKProcessor {
  private TopKProcessor() {}

  /** The key under which a task keeps the newest window end it has ranked. */
  private static final String EMITTED = "~emitted";

  public static void main(String[] args) throws InterruptedException {
    Properties props = TopKStreams.properties("TopKProcessor", args);
    String input = args[1];
    String output = args[2];
    String metric = args[5];
    int k = Integer.parseInt(args[6]);
    long window = Long.parseLong(args[7]);
    long advance = Long.parseLong(args[8]);
    long grace = Long.parseLong(args[9]);

    StreamsBuilder builder = new StreamsBuilder();
    builder.addStateStore(
        Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("buckets"), Serdes.String(), Serdes.Long())
            .withCachingEnabled());
    builder.addStateStore(
        Stores.keyValueStoreBuilder(
                Stores.persistentKeyValueStore("partials"), Serdes.String(), Serdes.ByteArray())
            .withCachingEnabled());
    ObjectMapper json = new ObjectMapper();
    AtomicBoolean first = new AtomicBoolean(true);
    builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
        .process(() -> new Counter(json, first, metric, k, window, advance, grace), "buckets")
        .repartition(Repartitioned.with(Serdes.String(), Serdes.ByteArray()).withName("lists"))
        .process(() -> new Merger(k), "partials")
        .to(output, Produced.with(Serdes.String(), Serdes.String()));

    TopKStreams.run(builder.build(), props);
  }

  /** A bucket's key prefix: fixed width, so that the store's byte order is the buckets'. */
  static String bucketPrefix(long bucket) {
    return String.format("%019d|", bucket);
  }

  /**
   * Counts a partition's events per (bucket, scope, key) and forwards, per closed window end
   * and scope, the partition's top k as {@code scope@end -> partition + list}.
   */
  static final class Counter implements Processor<String, String, String, byte[]> {
    private final ObjectMapper json;
    private final AtomicBoolean first;
    private final String metric;
    private final int k;
    private final long window;
    private final long advance;
    private final long grace;
    private ProcessorContext<String, byte[]> context;
    private KeyValueStore<String, Long> buckets;
    private Long emitted;

    Counter(
        ObjectMapper json,
        AtomicBoolean first,
        String metric,
        int k,
        long window,
        long advance,
        long grace) {
      this.json = json;
      this.first = first;
      this.metric = metric;
      this.k = k;
      this.window = window;
      this.advance = advance;
      this.grace = grace;
    }

    @Override
    public void init(ProcessorContext<String, byte[]> context) {
      this.context = context;
      this.buckets = context.getStateStore("buckets");
      this.emitted = buckets.get(EMITTED);
    }

    @Override
    public void process(Record<String, String> record) {
      TopKStreams.reportFirst(first);
      if (record.key() == null || !TopKStreams.isCounted(json, record.value(), metric)) {
        return;
      }
      long time = record.timestamp();
      long streamTime = context.currentStreamTimeMs();
      // The newest end already closed: its window and every earlier one are final.
      long closed = Math.floorDiv(streamTime - grace, advance) * advance;
      if (emitted == null) {
        emitted = closed;
      }
      // Late for every window it falls in: dropped, as the DSL drops it.
      if (time + window <= closed) {
        return;
      }
      String key = bucketPrefix(Math.floorDiv(time, advance)) + record.key();
      Long count = buckets.get(key);
      buckets.put(key, count == null ? 1L : count + 1);
      for (long end = emitted + advance; end <= closed; end += advance) {
        rank(end);
        emitted = end;
        buckets.put(EMITTED, emitted);
      }
    }

    /** Sums the buckets of the window ending at {@code end}, forwards each scope's top k. */
    private void rank(long end) {
      Map<String, Map<String, Long>> byScope = new HashMap<>();
      long from = Math.floorDiv(end - window, advance);
      long to = Math.floorDiv(end, advance);
      try (KeyValueIterator<String, Long> it =
          buckets.range(bucketPrefix(from), bucketPrefix(to))) {
        while (it.hasNext()) {
          KeyValue<String, Long> entry = it.next();
          // bucket|metric|scope|key
          String[] parts = entry.key.split("\\|", 4);
          if (parts.length == 4) {
            byScope.computeIfAbsent(parts[2], s -> new HashMap<>()).merge(parts[3], entry.value, Long::sum);
          }
        }
      }
      int partition = context.recordMetadata().map(m -> m.partition()).orElse(-1);
      for (Map.Entry<String, Map<String, Long>> scope : byScope.entrySet()) {
        TopList list = new TopList();
        for (Map.Entry<String, Long> kc : scope.getValue().entrySet()) {
          list.add(new KeyCount(kc.getKey(), kc.getValue()), k);
        }
        byte[] encoded = TopList.SERDE.serializer().serialize(null, list);
        byte[] value = ByteBuffer.allocate(4 + encoded.length).putInt(partition).put(encoded).array();
        context.forward(new Record<>(scope.getKey() + "@" + end, value, end));
      }
      // Buckets before the next window's start are in no later window.
      List<String> expired = new ArrayList<>();
      long keepFrom = Math.floorDiv(end + advance - window, advance);
      try (KeyValueIterator<String, Long> it = buckets.range(bucketPrefix(0), bucketPrefix(keepFrom))) {
        while (it.hasNext()) {
          expired.add(it.next().key);
        }
      }
      expired.forEach(buckets::delete);
    }
  }

  /** Merges the partitions' lists of one (scope, window end) into its top k. */
  static final class Merger implements Processor<String, byte[], String, String> {
    private final int k;
    private ProcessorContext<String, String> context;
    private KeyValueStore<String, byte[]> partials;

    Merger(int k) {
      this.k = k;
    }

    @Override
    public void init(ProcessorContext<String, String> context) {
      this.context = context;
      this.partials = context.getStateStore("partials");
    }

    @Override
    public void process(Record<String, byte[]> record) {
      ByteBuffer value = ByteBuffer.wrap(record.value());
      int partition = value.getInt();
      byte[] list = new byte[value.remaining()];
      value.get(list);
      String scopeEnd = record.key();
      partials.put(scopeEnd + "#" + String.format("%05d", partition), list);
      TopList merged = new TopList();
      try (KeyValueIterator<String, byte[]> it =
          partials.range(scopeEnd + "#", scopeEnd + "#~")) {
        while (it.hasNext()) {
          for (KeyCount kc : TopList.SERDE.deserializer().deserialize(null, it.next().value).items) {
            merged.add(kc, k);
          }
        }
      }
      context.forward(record.withValue(merged.render()));
    }
  }
}
