package io.github.sparkelastic.k8smock;

import io.fabric8.mockwebserver.http.Response;
import io.fabric8.mockwebserver.http.WebSocket;
import io.fabric8.mockwebserver.http.WebSocketListener;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * A watch's WebSocket listener whose close and failure callbacks run on a thread of their own,
 * not on the server's event loop.
 *
 * <p>Why: fabric8's watch listener, told on the event loop that its socket closed, waits up to a
 * minute for its sender thread to finish; that thread may be waiting (up to 30 s) for a write
 * that only the event loop can complete. Until the write times out, the server answers no
 * request at all. Every other callback is passed on as it comes (the deprecated
 * {@code ByteString} one is never called by the Vert.x server).
 */
final class ClosesOffTheLoop extends WebSocketListener {
  private static final ExecutorService CLOSERS =
      Executors.newCachedThreadPool(
          task -> {
            Thread thread = new Thread(task, "watch-closer");
            thread.setDaemon(true);
            return thread;
          });

  private final WebSocketListener inner;

  ClosesOffTheLoop(WebSocketListener inner) {
    this.inner = inner;
  }

  @Override
  public void onBeforeAccept(WebSocket webSocket, Response response) {
    inner.onBeforeAccept(webSocket, response);
  }

  @Override
  public void onOpen(WebSocket webSocket, Response response) {
    inner.onOpen(webSocket, response);
  }

  @Override
  public void onMessage(WebSocket webSocket, String text) {
    inner.onMessage(webSocket, text);
  }

  @Override
  public void onMessage(WebSocket webSocket, byte[] bytes) {
    inner.onMessage(webSocket, bytes);
  }

  @Override
  public void onPing(WebSocket webSocket, byte[] bytes) {
    inner.onPing(webSocket, bytes);
  }

  @Override
  public void onClosing(WebSocket webSocket, int code, String reason) {
    inner.onClosing(webSocket, code, reason);
  }

  @Override
  public void onClosed(WebSocket webSocket, int code, String reason) {
    CLOSERS.execute(() -> inner.onClosed(webSocket, code, reason));
  }

  @Override
  public void onFailure(WebSocket webSocket, Throwable failure, Response response) {
    CLOSERS.execute(() -> inner.onFailure(webSocket, failure, response));
  }
}
