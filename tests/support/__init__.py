"""What the tests share, each module named for what it is: real servers to start (Statehouse
replicas, SeaweedFS S3, Spark drivers) for the tests and the benchmarks, and the helpers several
test files use (request bodies, expected answers, filled jobs, pipelines and their oracles).
Test modules import from here, never from one another; what ``tests/client`` imports from here
imports only the client (that folder also runs where only the client wheel is installed)."""
