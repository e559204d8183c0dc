"""How the gateway reaches its engines: the three clients, engine processes and their links."""
