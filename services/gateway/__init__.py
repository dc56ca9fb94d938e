"""The browser gateway: gRPC-web and the Connect protocol over HTTP/1.1 for the player-facing APIs."""
