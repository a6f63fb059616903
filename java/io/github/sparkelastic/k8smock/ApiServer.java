package io.github.sparkelastic.k8smock;

import io.fabric8.kubernetes.client.server.mock.KubernetesCrudDispatcher;
import io.fabric8.kubernetes.client.server.mock.KubernetesMockServer;
import io.fabric8.mockwebserver.Context;
import io.fabric8.mockwebserver.MockWebServer;
import io.fabric8.mockwebserver.http.MockResponse;
import io.fabric8.mockwebserver.http.WebSocketListener;
import java.net.InetAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;

/**
 * A Kubernetes API server for the specs: fabric8's mock server in CRUD mode (objects kept as
 * sent, with UIDs and resource versions; 404, 409, label selectors and watches), over plain
 * HTTP on the address and port given; a watch's socket that closes is let go off the event loop
 * ({@link ClosesOffTheLoop}). It writes the port it listens on to the file given once
 * it serves, and runs until it is killed.
 *
 * <p>Usage: {@code ApiServer HOST PORT PORT_FILE} (PORT 0: a free one).
 */
public final class ApiServer {
  private ApiServer() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: ApiServer HOST PORT PORT_FILE");
      System.exit(2);
    }
    KubernetesMockServer server =
        new KubernetesMockServer(
            new Context(),
            new MockWebServer(),
            new HashMap<>(),
            new KubernetesCrudDispatcher() {
              @Override
              public MockResponse handleWatch(String path) {
                MockResponse response = super.handleWatch(path);
                WebSocketListener listener = response.getWebSocketListener();
                return listener == null
                    ? response
                    : response.withWebSocketUpgrade(new ClosesOffTheLoop(listener));
              }
            },
            false);
    server.init(InetAddress.getByName(args[0]), Integer.parseInt(args[1]));
    Path written = Path.of(args[2] + ".part");
    Files.write(written, String.valueOf(server.getPort()).getBytes(StandardCharsets.UTF_8));
    // Renamed into place, so a reader never sees half a number.
    Files.move(written, Path.of(args[2]));
    Thread.currentThread().join();
  }
}
