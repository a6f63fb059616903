/*
 * The Kafka Streams side of benchmarks/bench_throughput.py: a running count per key.
 *
 *   stream(input) -> groupByKey -> count (a RocksDB store, the default) -> toStream -> to(output)
 *
 * With the record cache off (statestore.cache.max.bytes=0) every update is forwarded, so the
 * output has one record per input record: the key and its new count (a long, 8 bytes big
 * endian, Kafka's LongSerializer). Two stream threads by default.
 *
 * Usage: java -cp '.cache/jars/kafka-streams/*:build/kafka-streams' ClickCounts \
 *            BOOTSTRAP INPUT OUTPUT GUARANTEE APPLICATION_ID STATE_DIR [THREADS]
 * GUARANTEE is exactly_once_v2 or at_least_once. It runs until it is stopped: SIGTERM closes
 * it cleanly (a last commit), as the benchmark does once the output is complete. It prints
 * "state RUNNING" and the like on stdout as the application changes state.
 */

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

public final class ClickCounts {
    private ClickCounts() {}

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 6 || args.length > 7) {
            System.err.println(
                    "usage: ClickCounts BOOTSTRAP INPUT OUTPUT GUARANTEE APPLICATION_ID STATE_DIR"
                            + " [THREADS]");
            System.exit(2);
        }
        String bootstrap = args[0];
        String input = args[1];
        String output = args[2];
        String guarantee = args[3];
        String applicationId = args[4];
        String stateDir = args[5];
        String threads = args.length == 7 ? args[6] : "2";

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        // No record cache: every update of a count goes downstream (one output per input).
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .groupByKey(Grouped.with(Serdes.String(), Serdes.ByteArray()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("click-counts")
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("state " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            System.out.println("failed: " + error);
            System.out.flush();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                    .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            stopped.countDown();
        }, "click-counts-shutdown"));
        streams.start();
        stopped.await();
        streams.close(Duration.ofSeconds(30));
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 1 : 0);
    }
}
