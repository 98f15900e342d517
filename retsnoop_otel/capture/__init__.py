"""What capture yields: the record formats of bpf/retsnoop.h, sessions assembled from them, and the data model."""
