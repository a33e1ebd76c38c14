package dev.eventfold.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * bench/projections.py's fold in Kafka Streams: the total of each key's sale values,
 * {@code groupByKey().aggregate()} into a RocksDB store with its changelog. Reads the bench's
 * event topic from the beginning until it has aggregated {@code events} events, then prints
 * one JSON line: events/s from the first event to the last, and the store's keys, total and
 * count (bench/peers/results.py checks them against what was produced).
 *
 * <p>Arguments: bootstrap servers, topic, stream threads, events, state directory.
 */
public final class Aggregate {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String STORE = "totals";

  private Aggregate() {}

  /** A key's state: its total and its number of events, as "total,count". */
  static String add(String state, long value) {
    long total = 0;
    long count = 0;
    if (state != null) {
      int comma = state.indexOf(',');
      total = Long.parseLong(state.substring(0, comma));
      count = Long.parseLong(state.substring(comma + 1));
    }
    return (total + value) + "," + (count + 1);
  }

  static long saleValue(String envelope) {
    try {
      JsonNode outer = JSON.readTree(envelope);
      return JSON.readTree(outer.get("payload").asText()).get("value").asLong();
    } catch (Exception e) {
      throw new IllegalArgumentException("not an Eventfold event: " + envelope, e);
    }
  }

  public static void main(String[] args) throws Exception {
    String bootstrap = args[0];
    String topic = args[1];
    int threads = Integer.parseInt(args[2]);
    long events = Long.parseLong(args[3]);
    Path stateDir = Path.of(args[4]);
    Files.createDirectories(stateDir);

    AtomicLong seen = new AtomicLong();
    AtomicLong firstNanos = new AtomicLong();
    AtomicLong lastNanos = new AtomicLong();
    CountDownLatch done = new CountDownLatch(1);

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()))
        .mapValues(Aggregate::saleValue)
        .groupByKey(org.apache.kafka.streams.kstream.Grouped.with(Serdes.String(), Serdes.Long()))
        .aggregate(() -> null, (key, value, state) -> {
              long now = System.nanoTime();
              firstNanos.compareAndSet(0, now);
              String next = add(state, value);
              if (seen.incrementAndGet() == events) {
                lastNanos.set(now);
                done.countDown();
              }
              return next;
            },
            Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String()).withValueSerde(Serdes.String()));

    Properties config = new Properties();
    config.put(StreamsConfig.APPLICATION_ID_CONFIG, "eventfold-peer-" + System.nanoTime());
    config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    config.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
    config.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
    config.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

    try (KafkaStreams streams = new KafkaStreams(builder.build(), config)) {
      streams.start();
      if (!done.await(30, TimeUnit.MINUTES)) {
        throw new IllegalStateException("aggregated " + seen.get() + " of " + events);
      }
      double seconds = (lastNanos.get() - firstNanos.get()) / 1e9;
      ReadOnlyKeyValueStore<String, String> store = storeOf(streams);
      long keys = 0;
      long total = 0;
      long count = 0;
      try (KeyValueIterator<String, String> all = store.all()) {
        while (all.hasNext()) {
          KeyValue<String, String> entry = all.next();
          int comma = entry.value.indexOf(',');
          keys++;
          total += Long.parseLong(entry.value.substring(0, comma));
          count += Long.parseLong(entry.value.substring(comma + 1));
        }
      }
      System.out.printf("{\"events_per_s\": %.0f, \"keys\": %d, \"total\": %d, \"count\": %d}%n",
          events / seconds, keys, total, count);
    }
  }

  private static ReadOnlyKeyValueStore<String, String> storeOf(KafkaStreams streams)
      throws InterruptedException {
    while (true) {
      try {
        return streams.store(StoreQueryParameters.fromNameAndType(
            STORE, QueryableStoreTypes.<String, String>keyValueStore()));
      } catch (org.apache.kafka.streams.errors.InvalidStateStoreException e) {
        Thread.sleep(100);  // a rebalance under way
      }
    }
  }
}
