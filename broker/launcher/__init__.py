"""What a training launcher installs: the async client, the `tandem` command line and the job file.

Depends on the generated API package and a few small libraries only (grpcio, protobuf, pydantic,
PyYAML), never on the hub's store, scheduling or Kubernetes client: `pip install tandem` without
the `hub` extra is enough for it.
"""
