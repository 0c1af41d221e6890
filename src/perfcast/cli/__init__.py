"""The `perfcast` command line. One module per command group."""
