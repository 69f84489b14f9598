"""The fleet simulator: many simulated GPU clusters, one broker, real extenders and agents; wire and fast modes."""
