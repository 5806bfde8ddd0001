"""One module per distribution backend."""
