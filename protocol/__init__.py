"""What the server and the client must agree on, in the client distribution so both import it:
the operations by name and the state kinds (``protocol.ops``), the API's paths and wire constants
(``protocol.routes``), how a request names its task attempt (``protocol.attempts``), the integer
bounds of the wire (``protocol.bounds``), replica URLs (``protocol.urls``), the domain errors'
base (``protocol.errors``) and Flink's key groups (``protocol.keygroups``)."""
