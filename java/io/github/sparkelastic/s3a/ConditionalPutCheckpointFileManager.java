/*
 * spark-elastic's checkpoint file manager for S3 (s3a://): a no-overwrite create is a
 * conditional PUT, so two drivers writing one micro-batch's offsets or commit file cannot
 * both succeed.
 *
 * Why: Spark's managers publish a file by writing a temporary one and renaming it. On S3 a
 * rename is a copy and a delete, and the no-overwrite check before it is a separate request:
 * a zombie driver and its successor can both pass the check, and the later copy wins. S3
 * makes an object visible whole when its upload completes, so nothing needs a temporary
 * name: this manager writes the object in place. A create that must not overwrite asks S3A
 * for a conditional write (If-None-Match: *, fs.option.create.conditional.overwrite,
 * HADOOP-19256), which S3 applies atomically: the loser's close fails and its query stops.
 * A cancelled stream is aborted (S3A's streams can abort), so nothing of it becomes visible.
 * Reading, listing and deleting are Spark's FileContext manager's, and so is all of a path
 * on another file system.
 *
 * Where it runs: in every JVM that touches a checkpoint on S3 (the driver for the offset and
 * commit logs, executors for state store files), created by Spark through
 * spark.sql.streaming.checkpointFileManagerClass, which spark_elastic.state.query_settings
 * sets for a query whose checkpoint is on s3a://. Nothing of it is serialized.
 */
package io.github.sparkelastic.s3a;

import java.io.IOException;
import java.io.UncheckedIOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.AbstractFileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager;

/** A checkpoint file manager whose files are written in place, no-overwrite ones conditionally. */
public final class ConditionalPutCheckpointFileManager
    extends AbstractFileContextBasedCheckpointFileManager {
  /** The S3A option (HADOOP-19256) that makes a create without overwrite a conditional PUT. */
  public static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  private final FileSystem fs;
  // Spark's own manager for a path elsewhere: a query copies its session's manager setting to
  // every log it keeps, a file sink's _spark_metadata on another file system included.
  private final CheckpointFileManager renaming;

  /**
   * Opens the file system of {@code path} with {@code conf}: Spark's constructor signature.
   *
   * @param path the checkpoint's root
   * @param conf the query's Hadoop configuration
   * @throws IOException when the file system cannot be opened
   */
  public ConditionalPutCheckpointFileManager(Path path, Configuration conf) throws IOException {
    super(path, conf);
    this.fs = path.getFileSystem(conf);
    this.renaming =
        "s3a".equals(fs.getScheme()) ? null : new FileContextBasedCheckpointFileManager(path, conf);
  }

  @Override
  public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(
      Path path, boolean overwriteIfPossible) {
    if (renaming != null) {
      return renaming.createAtomic(path, overwriteIfPossible);
    }
    try {
      FSDataOutputStreamBuilder<?, ?> builder = fs.createFile(path).overwrite(overwriteIfPossible);
      if (!overwriteIfPossible) {
        builder = builder.must(CONDITIONAL_CREATE, true);
      }
      FSDataOutputStream out = builder.build();
      return new Abortable(out);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** A stream whose close publishes the object and whose cancel aborts the upload. */
  private static final class Abortable extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream out;

    Abortable(FSDataOutputStream out) {
      super(out);
      this.out = out;
    }

    @Override
    public void cancel() {
      out.abort();
    }
  }
}
