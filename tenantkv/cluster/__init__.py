"""Cluster mode (docs/cluster.md): nodes coordinated through etcd, keys spread over
16,384 hash slots. Nothing here is imported by a single node without ``--cluster``."""
