"""OTLP: what a kernel session means as spans, their protobuf encoding, and the senders that deliver it."""
