"""Start real servers (Statehouse replicas, SeaweedFS S3) for the tests and the benchmarks."""
