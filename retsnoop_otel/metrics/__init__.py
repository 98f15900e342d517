"""Prometheus metrics: families read from the kernel's maps and the run's counters at scrape time, and the server."""
