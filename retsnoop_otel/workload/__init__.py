"""Which workload (container, Kubernetes pod) a kernel session belongs to, and the process's executable name.

Pure readers of cgroup paths, /proc and cgroupfs (every one takes its root directory), a node-scoped
pod watch against the API server, and the resolver that the runtime asks once per kept session.
"""
