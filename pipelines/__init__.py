"""Real PySpark jobs that keep their state in Statehouse."""
