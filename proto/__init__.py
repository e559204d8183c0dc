"""The wire between the gateway and its engines: typed messages, codec, sockets."""
