"""`retsnoop-otel agent`: the capture runtime driven by a YAML file, reloaded on SIGHUP."""
