"""What the server and the client must agree on, in the client distribution so both import it:
the operations by name (``protocol.ops``) and the integer bounds of the wire (``protocol.bounds``)."""
