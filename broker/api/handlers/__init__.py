"""Plain handler functions behind both edges (the gRPC servicers, the fleet view): authorised domain calls
in, domain results out, each family taking its bundle from broker.api.ports."""
