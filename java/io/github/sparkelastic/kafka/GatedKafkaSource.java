/*
 * spark-elastic's gated Kafka source: Spark's own Kafka source, held at a gate file.
 *
 * spark.readStream.format("gated-kafka") takes every option of Spark's "kafka" source and
 * one more, "gate": a JSON file {"topic": {"partition": offset}} that no micro-batch reads
 * past (a partition the file does not name, and a missing or unreadable file, admit nothing
 * new; the JSON null lifts the gate). It is the gate of the project's own sources
 * (spark_elastic/log/gate.py, spark_elastic/log/source.py: _gated), on Spark's reader: a
 * replaying warm-up holds its query at the old owners' commits with it.
 *
 * Why a wrapper: Spark's KafkaMicroBatchStream honours only read limits in latestOffset and
 * refuses endingOffsets in streaming queries, so nothing outside it can cap a running query.
 * This class asks Spark's stream for its end offsets, then clamps each partition's to the
 * gate; everything else (planning, reading on the executors, offsets in the checkpoint, the
 * consumer's options, metrics) is Spark's. The clamped offsets go back through Spark's own
 * deserializeOffset, so Spark's stream only ever sees its own offset class.
 *
 * Where it runs: the driver, in the query's stream execution thread (latestOffset once per
 * trigger, which reads the gate file). Nothing of it is serialized to executors: the input
 * partitions and reader factory are Spark's. Spark's connector is looked up by name at run
 * time, so this compiles against pyspark's jars alone and a session without the connector
 * gets one line naming it.
 */
package io.github.sparkelastic.kafka;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.EnumSet;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.metric.CustomMetric;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** The "gated-kafka" data source: Spark's Kafka source whose end offsets a gate file caps. */
public final class GatedKafkaSource implements TableProvider, DataSourceRegister {
  /** The option naming the gate file. */
  public static final String GATE = "gate";

  private static final String KAFKA_PROVIDER =
      "org.apache.spark.sql.kafka010.KafkaSourceProvider";
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final TypeReference<Map<String, Map<String, Long>>> OFFSETS =
      new TypeReference<Map<String, Map<String, Long>>>() {};

  private TableProvider kafka;

  @Override
  public String shortName() {
    return "gated-kafka";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return kafka().inferSchema(options);
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new GatedTable(kafka().getTable(schema, partitioning, properties));
  }

  private TableProvider kafka() {
    if (kafka == null) {
      try {
        kafka =
            (TableProvider)
                Class.forName(KAFKA_PROVIDER, true, Thread.currentThread().getContextClassLoader())
                    .getDeclaredConstructor()
                    .newInstance();
      } catch (ReflectiveOperationException e) {
        throw new IllegalStateException(
            "gated-kafka: expected Spark's Kafka connector (org.apache.spark:"
                + "spark-sql-kafka-0-10_2.13 and its jars) in spark.jars, found "
                + KAFKA_PROVIDER
                + " missing ("
                + e
                + ")");
      }
    }
    return kafka;
  }

  /** Spark's Kafka table, for micro-batch reads only. */
  private static final class GatedTable implements SupportsRead {
    private final Table kafka;

    GatedTable(Table kafka) {
      this.kafka = kafka;
    }

    @Override
    public String name() {
      return "gated-" + kafka.name();
    }

    // Deprecated for columns(), but it is what Spark's Kafka table defines.
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return kafka.schema();
    }

    @Override
    public Column[] columns() {
      return kafka.columns();
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      ScanBuilder builder = ((SupportsRead) kafka).newScanBuilder(options);
      String gate = options.get(GATE);
      return () -> new GatedScan(builder.build(), gate);
    }
  }

  /** Spark's Kafka scan, whose micro-batch stream is gated. */
  private static final class GatedScan implements Scan {
    private final Scan kafka;
    private final String gate;

    GatedScan(Scan kafka, String gate) {
      this.kafka = kafka;
      this.gate = gate;
    }

    @Override
    public StructType readSchema() {
      return kafka.readSchema();
    }

    @Override
    public String description() {
      return "gated " + kafka.description();
    }

    @Override
    public CustomMetric[] supportedCustomMetrics() {
      return kafka.supportedCustomMetrics();
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
      MicroBatchStream stream = kafka.toMicroBatchStream(checkpointLocation);
      return gate == null || gate.isEmpty() ? stream : new GatedStream(stream, gate);
    }
  }

  /** Spark's Kafka micro-batch stream with each trigger's end offsets clamped to the gate. */
  static final class GatedStream
      implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
    private final MicroBatchStream kafka;
    private final String gate;

    GatedStream(MicroBatchStream kafka, String gate) {
      this.kafka = kafka;
      this.gate = gate;
    }

    @Override
    public Offset latestOffset(Offset start, ReadLimit limit) {
      Offset end = ((SupportsTriggerAvailableNow) kafka).latestOffset(start, limit);
      if (end == null) {
        return null;
      }
      Map<String, Map<String, Long>> gated = gated(parse(end.json()), parse(start.json()), gate());
      if (gated == null) {
        return end;
      }
      // As Spark's stream answers when it has no partition at all: nothing to read.
      return gated.isEmpty() ? null : kafka.deserializeOffset(render(gated));
    }

    /** The gate's offsets; null when it is lifted; empty when the file is missing or torn. */
    private Map<String, Map<String, Long>> gate() {
      try {
        String text = new String(Files.readAllBytes(Paths.get(gate)), "UTF-8").trim();
        return "null".equals(text) ? null : parse(text);
      } catch (IOException | RuntimeException e) {
        return new TreeMap<>(); // being replaced, or not written yet: admit nothing new
      }
    }

    /**
     * End offsets no further than the gate and never behind where the batch begins. A
     * partition new since {@code begin} is read (from its earliest offset, as Spark reads new
     * partitions) only once the gate names it; null when there is no gate.
     *
     * <p>With Trigger.AvailableNow, Spark wants each end offset to name every partition it
     * prefetched, so a gate that leaves out a partition new since such a query began fails
     * it; the runtime's gated queries (replaying warm-ups) run on processing-time triggers.
     */
    static Map<String, Map<String, Long>> gated(
        Map<String, Map<String, Long>> end,
        Map<String, Map<String, Long>> begin,
        Map<String, Map<String, Long>> gate) {
      if (gate == null) {
        return null;
      }
      Map<String, Map<String, Long>> out = new TreeMap<>();
      end.forEach(
          (topic, partitions) ->
              partitions.forEach(
                  (partition, offset) -> {
                    Long from = begin.getOrDefault(topic, Map.of()).get(partition);
                    Long cap = gate.getOrDefault(topic, Map.of()).get(partition);
                    if (from == null && (cap == null || cap <= 0)) {
                      return; // a new partition the gate does not admit yet
                    }
                    long clamped = Math.min(offset, cap == null ? 0L : cap);
                    long value = from == null ? clamped : Math.max(clamped, from);
                    out.computeIfAbsent(topic, t -> new TreeMap<>()).put(partition, value);
                  }));
      return out;
    }

    private static Map<String, Map<String, Long>> parse(String json) {
      try {
        return JSON.readValue(json, OFFSETS);
      } catch (IOException e) {
        throw new IllegalArgumentException("gated-kafka: expected offsets as JSON, found " + json);
      }
    }

    private static String render(Map<String, Map<String, Long>> offsets) {
      try {
        return JSON.writeValueAsString(offsets);
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    }

    @Override
    public Offset latestOffset() {
      return kafka.latestOffset();
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
      return ((SupportsTriggerAvailableNow) kafka).getDefaultReadLimit();
    }

    @Override
    public Offset reportLatestOffset() {
      return ((SupportsTriggerAvailableNow) kafka).reportLatestOffset();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
      ((SupportsTriggerAvailableNow) kafka).prepareForTriggerAvailableNow();
    }

    @Override
    public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
      return kafka instanceof ReportsSourceMetrics
          ? ((ReportsSourceMetrics) kafka).metrics(latestConsumedOffset)
          : Map.of();
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
      return kafka.planInputPartitions(start, end);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
      return kafka.createReaderFactory();
    }

    @Override
    public Offset initialOffset() {
      return kafka.initialOffset();
    }

    @Override
    public Offset deserializeOffset(String json) {
      return kafka.deserializeOffset(json);
    }

    @Override
    public void commit(Offset end) {
      kafka.commit(end);
    }

    @Override
    public void stop() {
      kafka.stop();
    }

    @Override
    public String toString() {
      return "Gated" + kafka + "[" + gate + "]";
    }
  }
}
