"""The fleet view: a web page for the whole GPU pool, served by the broker beside its gRPC API."""
