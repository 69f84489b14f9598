"""gRPC servicers: thin edges that authenticate, call plain handlers and map broker errors to statuses."""
