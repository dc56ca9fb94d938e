/**
 * The fetch the SDK's transports call: the given one, with an abort that always ends the
 * response body.
 *
 * Connect's transports call fetch with `redirect: "error"` and end a call (a finished unary
 * call, a watch the consumer stopped or declared dead) by aborting the fetch's signal. In
 * Node's fetch (undici) that abort reaches the connection through a chain held only weakly
 * once fetch has returned its response: after a garbage collection the abort is lost, the
 * stream's socket stays open and keeps the Node process alive after its work is done (and,
 * in a reconnecting watch, leaves the previous stream open next to the new one). So this
 * wrapper reads the body itself and, when the signal aborts, cancels its own reader of the
 * body (which closes the connection whatever became of that chain) and errors the body it
 * handed out with the abort's reason.
 */
export function abortableFetch(base: () => typeof globalThis.fetch): typeof globalThis.fetch {
  return async (input, init) => {
    const response = await base()(input, init);
    const signal = init?.signal;
    if (!signal || response.body === null || response.status < 200) return response;
    return new Response(followSignal(response.body, signal), {
      status: response.status,
      statusText: response.statusText,
      headers: response.headers,
    });
  };
}

/** A stream of `body`'s chunks that ends (in error, with the reason) and cancels `body` when `signal` aborts. */
function followSignal(body: ReadableStream<Uint8Array>, signal: AbortSignal): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let sink: ReadableStreamDefaultController<Uint8Array> | undefined;
  const stop = (): void => {
    sink?.error(signal.reason);
    reader.cancel(signal.reason).catch(() => undefined);
  };
  return new ReadableStream<Uint8Array>({
    start(controller) {
      sink = controller;
      if (signal.aborted) stop();
      else signal.addEventListener("abort", stop, { once: true });
    },
    async pull(controller) {
      const chunk = await reader.read();
      if (!chunk.done) return controller.enqueue(chunk.value);
      signal.removeEventListener("abort", stop);
      controller.close();
    },
    cancel(reason) {
      signal.removeEventListener("abort", stop);
      return reader.cancel(reason);
    },
  });
}
