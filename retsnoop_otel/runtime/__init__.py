"""The one capture runtime behind both commands: kernel environment, probe sets, poll loop, sinks, /metrics."""
