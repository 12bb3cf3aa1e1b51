"""bls.transport: the ZeroMQ wire protocol, client, worker server and discovery."""
